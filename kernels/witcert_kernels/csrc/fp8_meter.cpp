// The fp8 meter's per-token pass, fused: one read of each stored key's bytes, in the
// engine's cache, gives the logits of every query row that meets it and the format logit
// bound of each. Head h is kv head h % kvh of layer h / kvh; the byte of request n's token
// s, channel c, sits at position start[n, h % kvh, s] + channels[c] of that layer's cache
// (flattened):
//
//   logits[n, h, m, s] = scale * sum_c q[n, h, m, c] * K[h][byte]
//   bound[n, h, m, s]  = (sum_c |q[n, h, m, c]| * W[h][byte]) * scale
//
// K is the exact float64 value of each code times the layer's float32 scale, W the code's
// residual witness (witcert_calculus.meters.formats.witness_table). Both sums run in
// float64 over the head dimension in channel order, one fused multiply-add per channel (a
// recursive sum; the margin of witcert_calculus.numerics.rounding.logit_margin bounds any
// order), eight tokens and up to four query rows at once. With AVX-512 (and `vectorized`)
// the same operations run in vector registers, and a tile of eight tokens that are
// consecutive bytes of each channel (a block of vLLM's vec layout) is read eight bytes at a
// time; the portable loops (reading token by token) give the same bits. The bound leaves
// rounded outward by the rule of witcert_calculus.numerics.rounding.outward with the
// caller's margin (gamma, alpha): next_up(b (1 + gamma) + alpha), except where it is exact
// (a token whose witnesses are all 0, a query row that is all 0) or not finite. A token
// that is not visible gets logit 0 and bound 0; inf * 0 in the bound saturates to inf.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kTile = 8;
constexpr int64_t kRows = 4;

// Rows r < R of a tile, per token j: sum_c q[r][c] key[c][j] and sum_c aq[r][c] wit[c][j],
// each summed in channel order (a recursive sum, one rounding per multiply-add), the R
// rows' sums side by side and the tile's tokens in one vector.
template <int R>
void tile_dots(const double* q, const double* aq, const double* key, const double* wit,
               int64_t d, double* lsum, double* bsum) {
  double l[R][kTile] = {}, b[R][kTile] = {};
  for (int64_t k = 0; k < d; ++k)
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < kTile; ++j) {
        l[r][j] = std::fma(q[r * d + k], key[k * kTile + j], l[r][j]);
        b[r][j] = std::fma(aq[r * d + k], wit[k * kTile + j], b[r][j]);
      }
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < kTile; ++j) {
      lsum[r * kTile + j] = l[r][j];
      bsum[r * kTile + j] = b[r][j];
    }
}

template <int R>
__attribute__((target("avx512f")))
void tile_dots_avx512(const double* q, const double* aq, const double* key, const double* wit,
                      int64_t d, double* lsum, double* bsum) {
  __m512d l[R], b[R];
  for (int r = 0; r < R; ++r) l[r] = _mm512_setzero_pd(), b[r] = _mm512_setzero_pd();
  for (int64_t k = 0; k < d; ++k) {
    const __m512d kv = _mm512_loadu_pd(key + k * kTile);
    const __m512d wv = _mm512_loadu_pd(wit + k * kTile);
    for (int r = 0; r < R; ++r) {
      l[r] = _mm512_fmadd_pd(_mm512_set1_pd(q[r * d + k]), kv, l[r]);
      b[r] = _mm512_fmadd_pd(_mm512_set1_pd(aq[r * d + k]), wv, b[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_pd(lsum + r * kTile, l[r]);
    _mm512_storeu_pd(bsum + r * kTile, b[r]);
  }
}

// The next double above x (std::nextafter(x, inf), without the library call).
inline double next_up(double x) {
  if (x == 0.0) return std::numeric_limits<double>::denorm_min();
  if (std::isinf(x) && x > 0.0) return x;
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = x > 0.0 ? bits + 1 : bits - 1;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// A row's logits and outward-rounded bounds of a tile's first `width` tokens, from its two
// sums, written at lo and bo (`seen`: the visible tokens, `exact`: those whose witnesses
// are all 0, one bit each; `zero_row`: the query row is all 0).
void store(const double* lsum, const double* bsum, int64_t width, unsigned seen,
           unsigned exact, bool zero_row, double scale, double gamma, double alpha,
           double* lo, double* bo) {
  for (int64_t j = 0; j < width; ++j) {
    if (!((seen >> j) & 1u)) {
      lo[j] = 0.0, bo[j] = 0.0;
      continue;
    }
    lo[j] = scale * lsum[j];
    double b = bsum[j] * scale;
    b = std::isnan(b) ? std::numeric_limits<double>::infinity() : b;
    if (std::isfinite(b) && !((exact >> j) & 1u) && !zero_row) {
      const double raised = b * (1.0 + gamma);
      b = next_up(raised + alpha);
    }
    bo[j] = b;
  }
}

// The same operations, eight tokens at once.
__attribute__((target("avx512f")))
void store_avx512(const double* lsum, const double* bsum, int64_t width, unsigned seen,
                  unsigned exact, bool zero_row, double scale, double gamma, double alpha,
                  double* lo, double* bo) {
  const __mmask8 live = static_cast<__mmask8>((1u << width) - 1u);
  const __mmask8 keep = static_cast<__mmask8>(seen & live);
  const __m512d zero = _mm512_setzero_pd();
  const __m512d inf = _mm512_set1_pd(std::numeric_limits<double>::infinity());
  const __m512d l = _mm512_maskz_mul_pd(keep, _mm512_set1_pd(scale), _mm512_loadu_pd(lsum));
  __m512d b = _mm512_mul_pd(_mm512_loadu_pd(bsum), _mm512_set1_pd(scale));
  b = _mm512_mask_mov_pd(b, _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), inf);
  const __mmask8 finite = _mm512_cmp_pd_mask(_mm512_sub_pd(b, b), zero, _CMP_EQ_OQ);
  const __mmask8 raise = static_cast<__mmask8>(keep & finite & ~exact & (zero_row ? 0u : 0xFFu));
  const __m512d raised = _mm512_add_pd(_mm512_mul_pd(b, _mm512_set1_pd(1.0 + gamma)),
                                       _mm512_set1_pd(alpha));
  // next up: one step away from 0 above it (inf stays), one step toward 0 below it
  const __m512i one = _mm512_set1_epi64(1);
  __m512i bits = _mm512_castpd_si512(raised);
  bits = _mm512_mask_add_epi64(bits, _mm512_cmp_pd_mask(raised, zero, _CMP_GT_OQ) &
                                         _mm512_cmp_pd_mask(raised, inf, _CMP_LT_OQ),
                               bits, one);
  bits = _mm512_mask_sub_epi64(bits, _mm512_cmp_pd_mask(raised, zero, _CMP_LT_OQ), bits, one);
  const __m512d up = _mm512_mask_mov_pd(
      _mm512_castsi512_pd(bits), _mm512_cmp_pd_mask(raised, zero, _CMP_EQ_OQ),
      _mm512_set1_pd(std::numeric_limits<double>::denorm_min()));
  b = _mm512_maskz_mov_pd(keep, _mm512_mask_mov_pd(b, raise, up));
  _mm512_mask_storeu_pd(lo, live, l);
  _mm512_mask_storeu_pd(bo, live, b);
}

using Dots = void (*)(const double*, const double*, const double*, const double*, int64_t,
                      double*, double*);
using Store = void (*)(const double*, const double*, int64_t, unsigned, unsigned, bool, double,
                       double, double, double*, double*);

// The tile's keys and witnesses, channel-major [d][kTile], when its tokens are kTile
// consecutive bytes of every channel (vLLM's vec layout: a block's keys stored [d][block]):
// the bytes of channel c at first + channels[c], looked up in the two tables. Returns the
// tokens whose witnesses are all 0, one bit each. The same values as the token-by-token
// fill, which the portable loops use for every tile.
__attribute__((target("avx512f")))
unsigned fill_consecutive_avx512(const uint8_t* first, const int64_t* channels, int64_t d,
                                 const double* kt, const double* wt, double* key,
                                 double* wit) {
  __mmask8 nonzero = 0;
  const __m512d zero = _mm512_setzero_pd();
  for (int64_t k = 0; k < d; ++k) {
    int64_t eight;
    std::memcpy(&eight, first + channels[k], sizeof eight);
    const __m512i code = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(eight));
    const __m512d w = _mm512_i64gather_pd(code, wt, 8);
    _mm512_storeu_pd(key + k * kTile, _mm512_i64gather_pd(code, kt, 8));
    _mm512_storeu_pd(wit + k * kTile, w);
    nonzero |= _mm512_cmp_pd_mask(w, zero, _CMP_NEQ_UQ);
  }
  return ~static_cast<unsigned>(nonzero) & 0xFFu;
}

std::tuple<at::Tensor, at::Tensor> fp8_logits_and_bound(
    const at::Tensor& q, at::TensorList caches, const at::Tensor& start,
    const at::Tensor& channels,
    const at::Tensor& key_lut, const at::Tensor& wit_lut, const at::Tensor& visible,
    double scale, double gamma, double alpha, bool vectorized) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kDouble, "q must be [N, H, M, d] float64");
  TORCH_CHECK(start.dim() == 3 && start.scalar_type() == at::kLong,
              "start must be [N, kvh, S] int64");
  TORCH_CHECK(channels.dim() == 1 && channels.scalar_type() == at::kLong,
              "channels must be [d] int64");
  TORCH_CHECK(key_lut.dim() == 2 && key_lut.size(1) == 256 &&
                  key_lut.scalar_type() == at::kDouble,
              "key_lut must be [H, 256] float64");
  TORCH_CHECK(wit_lut.sizes() == key_lut.sizes() && wit_lut.scalar_type() == at::kDouble,
              "wit_lut must be [H, 256] float64");
  TORCH_CHECK(visible.dim() == 2 && visible.scalar_type() == at::kBool,
              "visible must be [N, S] bool");
  const int64_t n = q.size(0), h = q.size(1), m = q.size(2), d = q.size(3);
  const int64_t kvh = start.size(1), s = start.size(2);
  TORCH_CHECK(start.size(0) == n && channels.size(0) == d && kvh > 0 && h % kvh == 0,
              "start must be [N, kvh, S] and channels [d] for q of shape [N, L * kvh, M, d]");
  TORCH_CHECK(static_cast<int64_t>(caches.size()) == h / kvh, "one cache per layer");
  TORCH_CHECK(key_lut.size(0) == h, "one lookup table per head");
  TORCH_CHECK(visible.size(0) == n && visible.size(1) == s, "visible must be [N, S]");
  std::vector<const uint8_t*> layer(caches.size());
  for (size_t l = 0; l < caches.size(); ++l) {
    TORCH_CHECK(caches[l].scalar_type() == at::kByte && caches[l].is_contiguous(),
                "each cache must be contiguous uint8");
    TORCH_CHECK(caches[l].numel() == caches[0].numel(), "the caches must have one size");
    layer[l] = caches[l].data_ptr<uint8_t>();
  }
  const auto sc = start.contiguous();
  const auto chc = channels.contiguous();
  if (sc.numel() > 0 && d > 0) {
    const int64_t lo = sc.min().item<int64_t>() + chc.min().item<int64_t>();
    const int64_t hi = sc.max().item<int64_t>() + chc.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < caches[0].numel(), "positions out of the caches' range");
  }
  const int64_t* sp = sc.data_ptr<int64_t>();
  const int64_t* chp = chc.data_ptr<int64_t>();
  const auto qc = q.contiguous();
  const auto kl = key_lut.contiguous();
  const auto wl = wit_lut.contiguous();
  const auto vc = visible.contiguous();
  auto logits = at::empty({n, h, m, s}, q.options());
  auto bound = at::empty({n, h, m, s}, q.options());
  const double* qp = qc.data_ptr<double>();
  const double* klp = kl.data_ptr<double>();
  const double* wlp = wl.data_ptr<double>();
  const bool* vp = vc.data_ptr<bool>();
  double* lp = logits.data_ptr<double>();
  double* bp = bound.data_ptr<double>();
  const bool avx512 = vectorized && __builtin_cpu_supports("avx512f");
  const Store write = avx512 ? store_avx512 : store;
  const Dots dots[kRows] = {
      avx512 ? tile_dots_avx512<1> : tile_dots<1>, avx512 ? tile_dots_avx512<2> : tile_dots<2>,
      avx512 ? tile_dots_avx512<3> : tile_dots<3>, avx512 ? tile_dots_avx512<4> : tile_dots<4>};
  at::parallel_for(0, n * h, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> key(d * kTile), wit(d * kTile), aq(m * d);
    std::vector<char> zero_row(m);
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t i = nh / h, head = nh % h;
      const double* qrow = qp + nh * m * d;
      for (int64_t r = 0; r < m; ++r) {
        bool zero = true;
        for (int64_t k = 0; k < d; ++k) {
          aq[r * d + k] = std::fabs(qrow[r * d + k]);
          zero = zero && qrow[r * d + k] == 0.0;
        }
        zero_row[r] = zero;
      }
      const double* kt = klp + head * 256;
      const double* wt = wlp + head * 256;
      const uint8_t* bytes = layer[head / kvh];
      const int64_t* starts = sp + (i * kvh + head % kvh) * s;
      for (int64_t t0 = 0; t0 < s; t0 += kTile) {
        const int64_t width = std::min(kTile, s - t0);
        unsigned seen = 0, exact = 0;  // one bit per token of the tile
        for (int64_t j = 0; j < width; ++j) seen |= static_cast<unsigned>(vp[i * s + t0 + j]) << j;
        bool consecutive = avx512 && width == kTile;
        for (int64_t j = 0; consecutive && j < kTile; ++j)
          consecutive = vp[i * s + t0 + j] && starts[t0 + j] == starts[t0] + j;
        if (consecutive) {  // one block's keys: kTile bytes of each channel side by side
          exact = fill_consecutive_avx512(bytes + starts[t0], chp, d, kt, wt, key.data(),
                                          wit.data());
        } else {  // the tile's keys and witnesses, channel-major (0 where not visible)
          for (int64_t j = 0; j < kTile; ++j) {
            const bool seen = j < width && vp[i * s + t0 + j];
            bool zero = true;
            const uint8_t* first = seen ? bytes + starts[t0 + j] : nullptr;
            for (int64_t k = 0; k < d; ++k) {
              const uint8_t c = seen ? first[chp[k]] : 0;
              key[k * kTile + j] = seen ? kt[c] : 0.0;
              wit[k * kTile + j] = seen ? wt[c] : 0.0;
              zero = zero && wit[k * kTile + j] == 0.0;
            }
            exact |= static_cast<unsigned>(zero) << j;
          }
        }
        for (int64_t r0 = 0; r0 < m; r0 += kRows) {
          const int64_t rows = std::min(kRows, m - r0);
          double lsum[kRows * kTile], bsum[kRows * kTile];
          const double* qr = qrow + r0 * d;
          const double* ar = aq.data() + r0 * d;
          dots[rows - 1](qr, ar, key.data(), wit.data(), d, lsum, bsum);
          for (int64_t r = 0; r < rows; ++r)
            write(lsum + r * kTile, bsum + r * kTile, width, seen, exact, zero_row[r0 + r],
                  scale, gamma, alpha, lp + (nh * m + r0 + r) * s + t0,
                  bp + (nh * m + r0 + r) * s + t0);
        }
      }
    }
  });
  return {logits, bound};
}

}  // namespace

TORCH_LIBRARY(witcert_fused, m) {
  m.def("fp8_logits_and_bound(Tensor q, Tensor[] caches, Tensor start, Tensor channels, "
        "Tensor key_lut, Tensor wit_lut, Tensor visible, float scale, float gamma, "
        "float alpha, bool vectorized) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(witcert_fused, CPU, m) {
  m.impl("fp8_logits_and_bound", &fp8_logits_and_bound);
}
