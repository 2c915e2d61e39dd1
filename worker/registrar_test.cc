// DescribeWorker: a CPU worker reports the host's memory; a GPU worker
// reports its device and the KV pool it reserves there, so that placement
// counts the pool instead of the sessions x context estimate.
#include "worker/registrar.h"

#include "gtest/gtest.h"
#include "worker/device_stage.h"

namespace strata::worker {
namespace {

TEST(RegistrarTest, CpuWorkerReportsTheHostsMemory) {
  const RegistrarOptions o{
      .coordinator = "", .address = "127.0.0.1:1234", .name = "w0", .gpu = std::nullopt, .gpu_kv_bytes = 0};
  const v1::RegisterRequest r = DescribeWorker(o);
  EXPECT_EQ(r.address(), "127.0.0.1:1234");
  EXPECT_EQ(r.name(), "w0");
  ASSERT_EQ(r.devices_size(), 1);
  EXPECT_EQ(r.devices(0).name(), "cpu");
  EXPECT_GT(r.devices(0).total_bytes(), 0);
  EXPECT_GT(r.devices(0).free_bytes(), 0);
  EXPECT_LE(r.devices(0).free_bytes(), r.devices(0).total_bytes());
  EXPECT_EQ(r.devices(0).kv_pool_bytes(), 0);
}

TEST(RegistrarTest, GpuWorkerReportsItsDeviceAndKvPool) {
  const RegistrarOptions o{
      .coordinator = "", .address = "127.0.0.1:1234", .name = "w1", .gpu = 3, .gpu_kv_bytes = int64_t{5} << 30};
  const v1::RegisterRequest r = DescribeWorker(o);
  ASSERT_EQ(r.devices_size(), 1);
  EXPECT_EQ(r.devices(0).name(), "cuda:3");
  EXPECT_EQ(r.devices(0).kv_pool_bytes(), int64_t{5} << 30);
  // Memory as the device reports it; 0 (unknown) without CUDA or that device.
  int64_t total = 0, free = 0;
  if (DeviceStage::Memory(3, &total, &free).ok()) {
    EXPECT_GT(r.devices(0).total_bytes(), 0);
  } else {
    EXPECT_EQ(r.devices(0).total_bytes(), 0);
    EXPECT_EQ(r.devices(0).free_bytes(), 0);
  }
}

}  // namespace
}  // namespace strata::worker
