// Attention kernel benchmark on the GPU (DeepSeek-V3 shapes: 128 heads,
// 576/512, one query token): time, achieved bytes/s and FLOP/s, and the ratio
// to the floor max(bytes / copy bandwidth, FLOPs / matrix peak), with the copy
// bandwidth measured in the same run. The matrix peak is passed in
// (--matrix_tflops, measured by bench/gpu_check.sh) or the bf16 datasheet value.
//
// Usage: strata_attention_bench [--matrix_tflops=X] [--quick] [--graph] [--case=TEXT]
// (--case: only the cases whose name contains TEXT, e.g. for a profiler run;
// --graph: each decode case is also timed replayed from a CUDA graph)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/dsa_indexer.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/reference.h"
#include "kernels/cuda/test_util.h"

namespace {

using strata::cuda::testing::DeviceBuffer;
namespace sc = strata::cuda;
namespace ref = strata::cuda::reference;

constexpr int kHeads = 128;
constexpr int kWarmup = 3;
constexpr int kReps = 20;
constexpr size_t kRotateBytes = size_t{384} << 20;  // rotate inputs until this much is touched

struct Ceilings {
  double copy_bw = 0;       // bytes/s, read + written
  double matrix_flops = 0;  // FLOP/s
};

struct Row {
  std::string name;
  double us = 0, bytes = 0, flops = 0, floor_us = 0;
};
std::vector<Row> g_rows;

// Median of per-repetition event timings of fn(rep).
template <typename F>
double TimeUs(F&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn(i);
  STRATA_CUDA_OK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * kReps);
  for (auto& e : ev) STRATA_CUDA_OK(cudaEventCreate(&e));
  for (int i = 0; i < kReps; ++i) {
    STRATA_CUDA_OK(cudaEventRecord(ev[2 * i]));
    fn(kWarmup + i);
    STRATA_CUDA_OK(cudaEventRecord(ev[2 * i + 1]));
  }
  STRATA_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> ms(kReps);
  for (int i = 0; i < kReps; ++i) STRATA_CUDA_OK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[kReps / 2] * 1000.0;
}

// The same per launch, replayed from one CUDA graph of kReps launches (as a
// server replays a captured decode step): fn(rep, stream) launches on
// `stream`. What the launch costs the host and the gap between kernels that
// event timing of single launches includes are left out.
template <typename F>
double TimeGraphUs(F&& fn) {
  cudaStream_t s;
  STRATA_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  STRATA_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kReps; ++i) fn(kWarmup + i, s);
  STRATA_CUDA_OK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  STRATA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  STRATA_CUDA_OK(cudaEventCreate(&e0));
  STRATA_CUDA_OK(cudaEventCreate(&e1));
  std::vector<float> ms(5);
  STRATA_CUDA_OK(cudaGraphLaunch(exec, s));  // warm-up
  for (float& m : ms) {
    STRATA_CUDA_OK(cudaEventRecord(e0, s));
    STRATA_CUDA_OK(cudaGraphLaunch(exec, s));
    STRATA_CUDA_OK(cudaEventRecord(e1, s));
    STRATA_CUDA_OK(cudaEventSynchronize(e1));
    STRATA_CUDA_OK(cudaEventElapsedTime(&m, e0, e1));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0 / kReps;
}

void Report(const Ceilings& c, const std::string& name, double us, double bytes, double flops) {
  Row r{name, us, bytes, flops, 0};
  r.floor_us = std::max(bytes / c.copy_bw, flops / c.matrix_flops) * 1e6;
  std::printf("%-34s %10.1f us  %8.2f TB/s  %8.1f TFLOP/s  floor %8.1f us  x%.2f\n", name.c_str(), us,
              bytes / us * 1e-6, flops / us * 1e-6, r.floor_us, us / r.floor_us);
  std::fflush(stdout);
  g_rows.push_back(r);
}

Ceilings MeasureCeilings(double matrix_tflops) {
  Ceilings c;
  const size_t n = size_t{2} << 30;
  DeviceBuffer a(n), b(n);
  STRATA_CUDA_OK(cudaMemset(a.as<void>(), 1, n));
  const double us = TimeUs([&](int) { STRATA_CUDA_OK(cudaMemcpyAsync(b.as<void>(), a.as<void>(), n, cudaMemcpyDeviceToDevice)); });
  c.copy_bw = 2.0 * n / (us * 1e-6);
  c.matrix_flops = matrix_tflops * 1e12;
  std::printf("ceilings: device copy %.2f TB/s (read+write, 2 GiB), matrix %.0f TFLOP/s (bf16)\n",
              c.copy_bw * 1e-12, matrix_tflops);
  return c;
}

// Device copies of one paged cache, rotated between repetitions.
struct DeviceKv {
  std::vector<DeviceBuffer> pools;
  DeviceBuffer table, lens;
};

DeviceKv Upload(const ref::PagedKv& kv) {
  DeviceKv d;
  const size_t bytes = kv.pool.size();
  const int copies = static_cast<int>(std::clamp<size_t>(kRotateBytes / std::max<size_t>(bytes, 1), 1, 8));
  for (int i = 0; i < copies; ++i) {
    d.pools.emplace_back(bytes);
    d.pools.back().Upload(kv.pool.data(), bytes);
  }
  d.table = DeviceBuffer(kv.page_table.size() * 4);
  d.table.Upload(kv.page_table.data(), kv.page_table.size() * 4);
  d.lens = DeviceBuffer(kv.seq_lens.size() * 4);
  d.lens.Upload(kv.seq_lens.data(), kv.seq_lens.size() * 4);
  return d;
}

int g_sms = 132;
std::string g_case;  // --case=TEXT: only the cases whose name contains TEXT
bool g_graph = false;  // --graph: decode cases timed from a CUDA graph too

bool Selected(const std::string& name) { return g_case.empty() || name.find(g_case) != std::string::npos; }

// Dense (topk == 0) or sparse MLA decode for the given context lengths, timed
// once per split policy in `min_tiles` (dense: min_tiles_per_split; sparse:
// sparse_min_tiles_per_split) on the same data. `labels` name the variants.
// cap_tiles >= 0 cuts every split to its first cap_tiles tiles (dense only):
// the launch's cost with the same blocks, queries, partials and merge but
// (almost) no cache rows, to separate a block's fixed cost from its rows.
void BenchDecode(const Ceilings& c, const std::string& name, const std::vector<int64_t>& lens,
                 int topk, const std::vector<int>& min_tiles, const std::vector<std::string>& labels,
                 int cap_tiles = -1) {
  if (!Selected(name)) return;
  const int batch = static_cast<int>(lens.size());
  const uint64_t seed = strata::cuda::testing::FreshSeed();
  const ref::PagedKv kv = ref::MakeRandomKv(lens, seed, 16);
  DeviceKv d = Upload(kv);
  strata::cuda::testing::Rng rng(seed + 5);
  std::vector<uint16_t> qa(static_cast<size_t>(batch) * kHeads * 512), qp(static_cast<size_t>(batch) * kHeads * 64);
  for (auto& x : qa) x = strata::cuda::testing::ToBf16Bits(rng.Normal());
  for (auto& x : qp) x = strata::cuda::testing::ToBf16Bits(rng.Normal());
  DeviceBuffer dqa(qa.size() * 2), dqp(qp.size() * 2);
  dqa.Upload(qa.data(), qa.size() * 2);
  dqp.Upload(qp.data(), qp.size() * 2);
  std::vector<int> idx;
  if (topk > 0) {
    for (int b = 0; b < batch; ++b) {
      std::vector<int> all(lens[b]);
      for (int64_t i = 0; i < lens[b]; ++i) all[i] = static_cast<int>(i);
      for (int i = 0; i < topk && i < lens[b]; ++i) std::swap(all[i], all[i + rng.Below(lens[b] - i)]);
      all.resize(topk, -1);
      std::sort(all.begin(), all.begin() + std::min<int64_t>(topk, lens[b]));
      idx.insert(idx.end(), all.begin(), all.end());
    }
  }
  DeviceBuffer didx(std::max<size_t>(4, idx.size() * 4));
  if (!idx.empty()) didx.Upload(idx.data(), idx.size() * 4);
  std::vector<int64_t> plan_lens(batch);
  for (int b = 0; b < batch; ++b) plan_lens[b] = topk > 0 ? topk : lens[b];
  DeviceBuffer out(static_cast<size_t>(batch) * kHeads * 512 * 4), lse(static_cast<size_t>(batch) * kHeads * 4);
  double rows = 0;
  for (int b = 0; b < batch; ++b) rows += topk > 0 ? std::min<int64_t>(topk, lens[b]) : lens[b];
  // Bytes: the cache rows read, queries in, outputs out; FLOPs of Q.K and P.V.
  auto bytes_of = [&](double r) { return r * (sc::kRowDim + 8) + batch * kHeads * (576.0 * 2 + 512 * 4 + 4); };
  auto flops_of = [](double r) { return r * kHeads * (576.0 + 512.0) * 2; };
  for (size_t v = 0; v < min_tiles.size(); ++v) {
    sc::MlaSplitPolicy pol;
    pol.num_sms = g_sms;
    if (topk > 0) {
      pol.sparse_min_tiles_per_split = min_tiles[v];
    } else {
      pol.min_tiles_per_split = min_tiles[v];
    }
    sc::MlaDecodePlan plan = sc::PlanMlaDecode(plan_lens.data(), batch, kHeads, pol, topk > 0);
    if (cap_tiles >= 0) {
      rows = 0;
      for (int i = 0; i < plan.num_work; ++i) {
        int* w = &plan.work[4 * i];
        w[3] = std::min(w[3], w[2] + cap_tiles);
        rows += std::max<int64_t>(0, std::min<int64_t>(int64_t{w[3]} * 64, lens[w[0]]) - int64_t{w[2]} * 64);
      }
    }
    DeviceBuffer work(plan.work.size() * 4), offs(plan.split_offset.size() * 4);
    work.Upload(plan.work.data(), plan.work.size() * 4);
    offs.Upload(plan.split_offset.data(), plan.split_offset.size() * 4);
    DeviceBuffer op(sc::MlaPartialFloats(plan.total_splits, kHeads) * 4 + 4),
        ml(static_cast<size_t>(plan.total_splits) * kHeads * 8 + 4);
    sc::MlaDecodeParams p;
    p.q_abs = dqa.as<void>();
    p.q_pe = dqp.as<void>();
    p.q_is_bf16 = true;
    p.batch = batch;
    p.heads = kHeads;
    p.softmax_scale = 1.0f / std::sqrt(192.0f);
    p.page_table = d.table.as<int>();
    p.page_table_stride = kv.stride;
    p.seq_lens = d.lens.as<int>();
    p.indices = idx.empty() ? nullptr : didx.as<int>();
    p.index_stride = topk;
    p.work = work.as<int>();
    p.num_work = plan.num_work;
    p.split_offset = offs.as<int>();
    p.o_partial = op.as<float>();
    p.ml_partial = ml.as<float>();
    p.out = out.as<float>();
    p.lse = lse.as<float>();
    auto launch = [&](int rep, cudaStream_t stream) {
      p.pool = d.pools[rep % d.pools.size()].as<uint8_t>();
      STRATA_CUDA_OK(sc::LaunchMlaDecode(p, stream));
    };
    const double us = TimeUs([&](int rep) { launch(rep, nullptr); });
    char label[200];
    std::snprintf(label, sizeof label, "%s%s (%d splits)", name.c_str(), labels[v].c_str(), plan.total_splits);
    Report(c, label, us, bytes_of(rows), flops_of(rows));
    if (g_graph) Report(c, std::string(label) + " graph", TimeGraphUs(launch), bytes_of(rows), flops_of(rows));
  }
}

// The indexer and top-k over `batch` requests of t tokens each: alone (the
// scores), top-k alone, one after the other and fused. The B = 1 cases also
// time the single-block top-k.
void BenchIndexer(const Ceilings& c, int batch, int64_t t, int k) {
  if (!Selected("indexer top-k")) return;
  const int heads = 64;
  const uint64_t seed = strata::cuda::testing::FreshSeed();
  const ref::PagedKv keys = ref::MakeRandomIndexKeys(std::vector<int64_t>(batch, t), seed, 16);
  DeviceKv d = Upload(keys);
  strata::cuda::testing::Rng rng(seed + 9);
  std::vector<uint16_t> q(static_cast<size_t>(batch) * heads * sc::kIndexDim);
  std::vector<float> w(static_cast<size_t>(batch) * heads);
  for (auto& x : q) x = strata::cuda::testing::ToBf16Bits(rng.Normal());
  for (auto& x : w) x = rng.Normal() * 0.1f;
  DeviceBuffer dq(q.size() * 2), dw(w.size() * 4), scores(static_cast<size_t>(batch) * t * 4),
      idx(static_cast<size_t>(batch) * k * 4);
  dq.Upload(q.data(), q.size() * 2);
  dw.Upload(w.data(), w.size() * 4);
  sc::DsaIndexerParams p;
  p.q = dq.as<void>();
  p.weights = dw.as<float>();
  p.batch = batch;
  p.index_heads = heads;
  p.page_table = d.table.as<int>();
  p.page_table_stride = keys.stride;
  p.seq_lens = d.lens.as<int>();
  p.max_seq_len = t;
  p.scores = scores.as<float>();
  p.score_stride = t;
  DeviceBuffer ws(sc::TopkWorkspaceBytes(batch, t));
  STRATA_CUDA_OK(cudaMemset(ws.as<void>(), 0, ws.bytes()));
  sc::TopkParams tp{scores.as<float>(), t, d.lens.as<int>(), batch, k, idx.as<int>()};
  tp.workspace = ws.as<void>();
  sc::TopkParams tp1 = tp;  // the single-block kernel
  tp1.workspace = nullptr;
  const double key_bytes = static_cast<double>(batch) * t * (sc::kIndexDim + 4.0);
  const double flops = static_cast<double>(batch) * t * heads * sc::kIndexDim * 2;
  char shape[64];
  std::snprintf(shape, sizeof shape, "T=%lldk%s", static_cast<long long>(t / 1024),
                batch == 1 ? "" : (" B=" + std::to_string(batch)).c_str());
  const std::string sh = shape, b1 = batch == 1 ? " B=1" : "";
  const double us_score = TimeUs([&](int rep) {
    p.pool = d.pools[rep % d.pools.size()].as<uint8_t>();
    STRATA_CUDA_OK(sc::LaunchDsaIndexer(p, nullptr));
  });
  Report(c, "indexer scores " + sh, us_score, key_bytes + batch * t * 4.0, flops);
  if (batch == 1) {
    const double us_topk1 = TimeUs([&](int) { STRATA_CUDA_OK(sc::LaunchTopk(tp1, nullptr)); });
    Report(c, "top-2048 of 128k scores, 1 block", us_topk1, t * 4.0 + k * 4.0, 0);
  }
  const double us_topk = TimeUs([&](int) { STRATA_CUDA_OK(sc::LaunchTopk(tp, nullptr)); });
  Report(c, "top-2048 of " + sh + " scores", us_topk, batch * (t * 4.0 + k * 4.0), 0);
  const double us_both = TimeUs([&](int rep) {
    p.pool = d.pools[rep % d.pools.size()].as<uint8_t>();
    STRATA_CUDA_OK(sc::LaunchDsaIndexer(p, nullptr));
    STRATA_CUDA_OK(sc::LaunchTopk(tp, nullptr));
  });
  Report(c, "indexer then top-k " + sh + b1, us_both, key_bytes, flops);
  const double us_fused = TimeUs([&](int rep) {
    p.pool = d.pools[rep % d.pools.size()].as<uint8_t>();
    STRATA_CUDA_OK(sc::LaunchDsaIndexerTopk(p, tp, nullptr));
  });
  Report(c, "indexer + top-k " + sh + b1 + " (fused)", us_fused, key_bytes, flops);
}

}  // namespace

int main(int argc, char** argv) {
  double matrix_tflops = 989.0;  // H100/H200 SXM dense bf16 datasheet; overridden by a measurement
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--matrix_tflops=", 0) == 0) matrix_tflops = std::atof(a.c_str() + 16);
    if (a == "--quick") quick = true;
    if (a == "--graph") g_graph = true;
    if (a.rfind("--case=", 0) == 0) g_case = a.substr(7);
  }
  if (!strata::cuda::testing::HaveDevice()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  STRATA_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, g_sms, prop.l2CacheSize >> 20);
  const Ceilings c = MeasureCeilings(matrix_tflops);

  const int64_t K = 1024;
  for (int64_t t : {32 * K, 128 * K, 512 * K, 1024 * K}) {
    if (quick && t > 128 * K) break;
    BenchDecode(c, "dense B=1 T=" + std::to_string(t / K) + "k", {t}, 0, {8}, {""});
  }
  // A B=1 launch's fixed cost: the 32k case's 128 blocks cut to 0, 1 and 4 tiles each.
  for (int cap : {0, 1, 4})
    BenchDecode(c, "dense B=1 T=32k cut to " + std::to_string(cap) + " tiles/split", {32 * K}, 0, {8}, {""}, cap);
  BenchDecode(c, "dense B=64 T=8k", std::vector<int64_t>(64, 8 * K), 0, {8, 32}, {"", " min32tiles"});
  {
    std::vector<int64_t> mixed;
    for (int i = 0; i < 64; ++i) mixed.push_back(512 * (1 + (i * 37) % 64));
    BenchDecode(c, "dense B=64 mixed 0.5k-32k", mixed, 0, {8}, {""});
  }
  // 32 tiles per split is one split per request (a k = 2048 selection is 32
  // tiles): no partials and no merge, the schedule of a kernel that sizes
  // its splits from the batch; next to it the same rows read contiguously.
  const std::vector<int> sparse_tiles = {1, 2, 8, 32};
  const std::vector<std::string> sparse_labels = {" 1 tile/split", " 2 tiles/split", " 8 tiles/split",
                                                  " 32 tiles/split"};
  BenchDecode(c, "dense B=64 T=2k", std::vector<int64_t>(64, 2 * K), 0, {32}, {" 32 tiles/split"});
  BenchDecode(c, "sparse k=2048 B=1 T=128k", {128 * K}, 2048, sparse_tiles, sparse_labels);
  BenchDecode(c, "sparse k=2048 B=64 T=8k", std::vector<int64_t>(64, 8 * K), 2048, sparse_tiles, sparse_labels);
  BenchIndexer(c, 1, 128 * K, 2048);
  BenchIndexer(c, 64, 8 * K, 2048);

  std::printf("\n| case | us | TB/s | TFLOP/s | floor us | x floor |\n|---|---|---|---|---|---|\n");
  for (const Row& r : g_rows)
    std::printf("| %s | %.1f | %.2f | %.1f | %.1f | %.2f |\n", r.name.c_str(), r.us, r.bytes / r.us * 1e-6,
                r.flops / r.us * 1e-6, r.floor_us, r.us / r.floor_us);
  return 0;
}
