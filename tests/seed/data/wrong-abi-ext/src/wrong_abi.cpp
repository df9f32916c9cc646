// torch passes -D_GLIBCXX_USE_CXX11_ABI=<its own>; this file overrides it before any include.
#undef _GLIBCXX_USE_CXX11_ABI
#define _GLIBCXX_USE_CXX11_ABI 1
#include <torch/extension.h>

static int64_t checked_numel(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() > 0, "wrong_abi_ext: a scalar has no rows");
  return x.numel();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("checked_numel", &checked_numel); }
