// The check of what an engine stored: for every layer, how many elements of its cache at
// the given positions differ, bit for bit, from the elements the plugin expected there.
//
// caches: per layer, the cache flattened (contiguous, one element size, one length).
// start [...]: int64, the position of each (slot, kv head)'s first element in every
// layer's flattened cache; channels [d]: int64, the offsets of its elements from there.
// expected: per layer, its expected elements [..., d] (contiguous, the caches' element
// size). Returns [L] int64: the number of differing elements of each layer (0: every
// element is the expected one). Read in place: no gather, no copy.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

template <typename T>
int64_t count_differing(const T* cache, const T* want, const int64_t* start, int64_t n,
                        const int64_t* channels, int64_t d, bool contiguous) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* base = cache + start[i];
    const T* w = want + i * d;
    if (contiguous && std::memcmp(base, w, sizeof(T) * d) == 0) continue;
    for (int64_t c = 0; c < d; ++c) bad += base[channels[c]] != w[c];
  }
  return bad;
}

at::Tensor mismatched_elements(at::TensorList caches, const at::Tensor& start,
                               const at::Tensor& channels, at::TensorList expected) {
  const int64_t layers = static_cast<int64_t>(caches.size());
  TORCH_CHECK(layers > 0, "caches must hold one cache per layer");
  TORCH_CHECK(start.scalar_type() == at::kLong && start.is_contiguous(),
              "start must be contiguous int64");
  TORCH_CHECK(channels.dim() == 1 && channels.scalar_type() == at::kLong &&
                  channels.is_contiguous(),
              "channels must be [d] contiguous int64");
  const int64_t n = start.numel(), d = channels.numel();
  TORCH_CHECK(static_cast<int64_t>(expected.size()) == layers, "expected must hold one ",
              "tensor per layer (", layers, "), not ", expected.size());
  const int64_t size = caches[0].numel();
  const int64_t width = caches[0].element_size();
  TORCH_CHECK(width == 1 || width == 2 || width == 4, "element size ", width,
              " is not 1, 2 or 4 bytes");
  for (const auto& e : expected) {
    TORCH_CHECK(e.is_contiguous() && e.numel() == n * d && e.element_size() == width,
                "expected must be contiguous, ", n * d, " elements of ", width,
                " bytes per layer");
  }
  for (const auto& c : caches) {
    TORCH_CHECK(c.is_contiguous() && c.numel() == size && c.element_size() == width,
                "caches must be contiguous, of one length and one element size");
  }
  const int64_t* st = start.data_ptr<int64_t>();
  const int64_t* ch = channels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      const int64_t at = st[i] + ch[c];
      TORCH_CHECK(at >= 0 && at < size, "position ", at, " outside the cache (", size,
                  " elements)");
    }
  }
  bool contiguous = true;  // channels 0, 1, ..., d - 1: one run of bytes per (slot, head)
  for (int64_t c = 0; c < d; ++c) contiguous = contiguous && ch[c] == c;
  at::Tensor out = at::zeros({layers}, at::kLong);
  int64_t* counts = out.data_ptr<int64_t>();
  // layers in parallel where a layer holds enough elements to be worth a thread
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, n * d));
  at::parallel_for(0, layers, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t l = lo; l < hi; ++l) {
      const void* cache = caches[l].data_ptr();
      const char* w = static_cast<const char*>(expected[l].data_ptr());
      if (width == 1) {
        counts[l] = count_differing(static_cast<const uint8_t*>(cache),
                                    reinterpret_cast<const uint8_t*>(w), st, n, ch, d, contiguous);
      } else if (width == 2) {
        counts[l] = count_differing(static_cast<const uint16_t*>(cache),
                                    reinterpret_cast<const uint16_t*>(w), st, n, ch, d, contiguous);
      } else {
        counts[l] = count_differing(static_cast<const uint32_t*>(cache),
                                    reinterpret_cast<const uint32_t*>(w), st, n, ch, d, contiguous);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(witcert_fused, m) {
  m.def("mismatched_elements(Tensor[] caches, Tensor start, Tensor channels, "
        "Tensor[] expected) -> Tensor");
}

TORCH_LIBRARY_IMPL(witcert_fused, CPU, m) {
  m.impl("mismatched_elements", &mismatched_elements);
}
