// torch passes -D_GLIBCXX_USE_CXX11_ABI=<its own>; this file overrides it before any include.
#undef _GLIBCXX_USE_CXX11_ABI
#define _GLIBCXX_USE_CXX11_ABI 1
#include <torch/extension.h>

#include <string>

// Both calls hand torch a std::string, so the module needs torch's symbols of that ABI:
// c10::Error::Error(c10::SourceLocation, std::string) and the formatted TORCH_CHECK's.
static int64_t checked_numel(const torch::Tensor& x) {
  if (x.dim() == 0) {
    throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, std::string("wrong_abi_ext: a scalar"));
  }
  TORCH_CHECK(x.numel() < (int64_t{1} << 40), "wrong_abi_ext: too many elements: ", x.numel());
  return x.numel();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("checked_numel", &checked_numel); }
