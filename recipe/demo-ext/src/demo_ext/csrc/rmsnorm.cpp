#include <torch/extension.h>

torch::Tensor rms_norm_cuda(const torch::Tensor& x, const torch::Tensor& weight, double eps);

static torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "demo_ext.rms_norm: tensors must be on a CUDA device");
  TORCH_CHECK(x.size(-1) == weight.numel(), "demo_ext.rms_norm: weight must match the last dimension");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "demo_ext.rms_norm: x and weight dtypes differ");
  return rms_norm_cuda(x.contiguous(), weight.contiguous(), eps);
}

TORCH_LIBRARY(demo_ext, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }
TORCH_LIBRARY_IMPL(demo_ext, CUDA, m) { m.impl("rms_norm", &rms_norm); }

// An importable module: `import demo_ext._C` loads the library and runs the registrations above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
