"""Generated gRPC code for the kubelet pod-resources v1 API (from api.proto; committed so runtime needs no protoc)."""
