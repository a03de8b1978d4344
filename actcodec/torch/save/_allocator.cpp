// torch's CPU allocator routed into an actcodec store (csrc/store.c): allocations of at
// least `threshold` bytes take pages of the store, the rest go to c10::alloc_cpu as before.
// A training step makes and frees thousands of large tensors; in the store they never
// fragment the process's heap, and their pages are reused step after step. Compiled against
// the installed torch on first use (actcodec/torch/allocator.py).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <cstring>
#include <torch/extension.h>

namespace {

using store_alloc_fn = void *(*)(void *, size_t);
using store_release_fn = int (*)(void *, void *);

struct Routes {
  void *store = nullptr;
  store_alloc_fn alloc = nullptr;
  store_release_fn release = nullptr;
  size_t threshold = 0;
};
Routes routes;  // set once, before the allocator is installed

// Every pointer this allocator hands out comes back here: the store's, or alloc_cpu's.
void release_any(void *p) {
  if (p != nullptr && routes.release(routes.store, p) != 0) c10::free_cpu(p);
}

struct StoreAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void *p = n >= routes.threshold ? routes.alloc(routes.store, n) : nullptr;
    if (p == nullptr) p = c10::alloc_cpu(n);  // small, or the store is out of memory
    return {p, p, &release_any, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_any; }
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

StoreAllocator allocator;
c10::Allocator *previous = nullptr;
constexpr uint8_t kPriority = 100;

void install(int64_t store, int64_t alloc, int64_t release, int64_t threshold) {
  if (previous == nullptr) {
    routes = {reinterpret_cast<void *>(store), reinterpret_cast<store_alloc_fn>(alloc),
              reinterpret_cast<store_release_fn>(release), static_cast<size_t>(threshold)};
    previous = c10::GetCPUAllocator();
  }
  routes.threshold = static_cast<size_t>(threshold);
  c10::SetCPUAllocator(&allocator, kPriority);
}

void uninstall() {
  if (previous != nullptr) c10::SetCPUAllocator(previous, kPriority);
}

bool installed() { return c10::GetCPUAllocator() == &allocator; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("uninstall", &uninstall);
  m.def("installed", &installed);
}
