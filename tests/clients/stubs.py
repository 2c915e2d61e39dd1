"""Python stubs for the Strata protocol, generated from proto/ at test time
with Debian's tools (grpc_tools when its protoc understands proto3
`optional`, otherwise the system protoc with grpc_python_plugin)."""
import os
import subprocess


def generate_stubs(source_dir, out, protos=("strata/v1/generation.proto", "strata/v1/worker.proto")):
    proto_dir = os.path.join(source_dir, "proto")
    protos = list(protos)
    try:
        from grpc_tools import protoc
        if protoc.main(["protoc", "-I" + proto_dir, "--python_out=" + out, "--grpc_python_out=" + out] + protos) == 0:
            return
    except ImportError:
        pass
    subprocess.check_call(["protoc", "-I" + proto_dir, "--python_out=" + out, "--grpc_out=" + out,
                           "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos)
