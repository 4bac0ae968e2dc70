// The meter's per-row sums, from the logits and the logit bounds of a group of rows, one
// pass over each row's tokens in cache (the torch meter, witcert_kernels.meter._meter_core,
// makes a float64 tensor per step of the same arithmetic). Row m of head h of request n is
// query row m % Q of that request; mask[n, m % Q, t] says whether it attends to token t:
//
//   p~_t   = the softmax of the masked logits, e_t = exp(s_t - max s) times 1 / sum e,
//            renormalized to p_t = p~_t / sum p~ (as the torch meter renormalizes)
//   log A  = log1p(sum_{p_t > 0} p_t expm1(c_t)), or, where that sum is not finite, the
//            log-sum-exp of log p_t + c_t over p_t > 0
//   log A- = log1p(sum_{p_t > 0} p_t expm1(-c_t)) where that sum is above -1/2, else the
//            log-sum-exp of log p_t - c_t
//   cmax   = the largest c_t over every token, masked ones included; where some c_t is not
//            finite, the largest finite one (or 0)
//
// with the number of tokens of positive weight and whether the premises hold (p~ finite and
// nonnegative with a positive sum; every c_t >= 0, not NaN). Each sum carries the relative
// error its count of terms allows in any order, the library's exp and expm1 within 1 ulp
// (witcert_calculus.numerics.rounding.tv_margin); the caller rounds the forms outward. With
// AVX-512 (and `vectorized`) eight tokens are summed at once, with the vector exp and expm1
// of torch's own CPU kernels (SLEEF, 1 ulp); the portable loops call the C library's.
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

// torch's SLEEF (linked into libtorch_cpu; sleef.h declares these only where the whole
// file is compiled for AVX-512)
extern "C" {
__attribute__((target("avx512f"))) __m512d Sleef_expd8_u10(__m512d);
__attribute__((target("avx512f"))) __m512d Sleef_expm1d8_u10(__m512d);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Row {
  double la, lm, cmax;
  int64_t positive;
  bool p_ok, c_ok;
};

// The sums of one row, before the logarithms.
struct Sums {
  double total, bplus, bminus, cmax_finite;
  bool p_ok, c_ok, all_finite;
  int64_t positive;
};

// log-sum-exp of x_t = log p_t + sign c_t over p_t > 0, as witcert_kernels.meter._lse:
// m + log(sum exp(x - m)) with m the largest term (NaN if one is), m itself if infinite.
double lse(const double* p, const double* c, int64_t s, double sign) {
  double m = -kInf;
  bool nan = false;
  for (int64_t t = 0; t < s; ++t)
    if (p[t] > 0.0) {
      const double x = std::log(p[t]) + sign * c[t];
      nan = nan || std::isnan(x);
      m = std::max(m, x);
    }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(m)) return m;
  double sum = 0.0;
  for (int64_t t = 0; t < s; ++t)
    if (p[t] > 0.0) sum += std::exp(std::log(p[t]) + sign * c[t] - m);
  return m + std::log(sum);
}

Row finish(const double* p, const double* c, int64_t s, const Sums& u) {
  Row r;
  r.p_ok = u.p_ok && std::isfinite(u.total) && u.total > 0.0;
  r.c_ok = u.c_ok;
  r.positive = u.positive;
  r.cmax = u.all_finite ? u.cmax_finite : std::max(u.cmax_finite, 0.0);
  r.la = std::isfinite(u.bplus) ? std::log1p(u.bplus) : lse(p, c, s, 1.0);
  r.lm = u.bminus > -0.5 ? std::log1p(u.bminus) : lse(p, c, s, -1.0);
  return r;
}

Row row_portable(const double* logit, const double* c, const bool* mask, int64_t s,
                 double* p) {
  double mx = -kInf;
  bool nan = false;
  for (int64_t t = 0; t < s; ++t)
    if (mask[t]) nan = nan || std::isnan(logit[t]), mx = std::max(mx, logit[t]);
  if (nan) mx = std::numeric_limits<double>::quiet_NaN();
  double z = 0.0;
  for (int64_t t = 0; t < s; ++t) {
    p[t] = mask[t] ? std::exp(logit[t] - mx) : 0.0;
    z += p[t];
  }
  const double inv = 1.0 / z;
  Sums u{0.0, 0.0, 0.0, -kInf, true, true, true, 0};
  for (int64_t t = 0; t < s; ++t) {
    p[t] *= inv;
    u.total += p[t];
    u.p_ok = u.p_ok && p[t] >= 0.0;
  }
  for (int64_t t = 0; t < s; ++t) {
    p[t] /= u.total;
    u.c_ok = u.c_ok && c[t] >= 0.0;
    if (std::isfinite(c[t]))
      u.cmax_finite = std::max(u.cmax_finite, c[t]);
    else
      u.all_finite = false;
    if (p[t] > 0.0) {
      ++u.positive;
      u.bplus += p[t] * std::expm1(c[t]);
      u.bminus += p[t] * std::expm1(-c[t]);
    }
  }
  return finish(p, c, s, u);
}

__attribute__((target("avx512f"))) inline __mmask8 bytes_set(const bool* m, int64_t width) {
  int64_t eight = 0;
  std::memcpy(&eight, m, static_cast<size_t>(width));
  const __m512i b = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(eight));
  return _mm512_test_epi64_mask(b, b);
}

__attribute__((target("avx512f")))
Row row_avx512(const double* logit, const double* c, const bool* mask, int64_t s, double* p) {
  const __m512d zero = _mm512_setzero_pd();
  __m512d vmax = _mm512_set1_pd(-kInf);
  __mmask8 nan = 0;
  for (int64_t t = 0; t < s; t += 8) {
    const int64_t width = std::min<int64_t>(8, s - t);
    const __mmask8 m = bytes_set(mask + t, width);
    const __m512d l = _mm512_maskz_loadu_pd(m, logit + t);
    nan |= _mm512_mask_cmp_pd_mask(m, l, l, _CMP_UNORD_Q);
    vmax = _mm512_mask_max_pd(vmax, m, vmax, l);
  }
  const __m512d mx = _mm512_set1_pd(nan ? std::numeric_limits<double>::quiet_NaN()
                                        : _mm512_reduce_max_pd(vmax));
  __m512d vz = zero;
  for (int64_t t = 0; t < s; t += 8) {
    const int64_t width = std::min<int64_t>(8, s - t);
    const __mmask8 m = bytes_set(mask + t, width);
    const __m512d e = _mm512_maskz_mov_pd(
        m, Sleef_expd8_u10(_mm512_sub_pd(_mm512_maskz_loadu_pd(m, logit + t), mx)));
    _mm512_mask_storeu_pd(p + t, static_cast<__mmask8>((1u << width) - 1u), e);
    vz = _mm512_add_pd(vz, e);
  }
  const __m512d inv = _mm512_set1_pd(1.0 / _mm512_reduce_add_pd(vz));
  __m512d vtotal = zero;
  __mmask8 bad_p = 0;
  for (int64_t t = 0; t < s; t += 8) {
    const __mmask8 live = static_cast<__mmask8>((1u << std::min<int64_t>(8, s - t)) - 1u);
    const __m512d pv = _mm512_mul_pd(_mm512_maskz_loadu_pd(live, p + t), inv);
    bad_p |= _mm512_mask_cmp_pd_mask(live, pv, zero, _CMP_NGE_UQ);
    vtotal = _mm512_add_pd(vtotal, pv);
  }
  Sums u{_mm512_reduce_add_pd(vtotal), 0.0, 0.0, -kInf, bad_p == 0, true, true, 0};
  const __m512d total = _mm512_set1_pd(u.total);
  __m512d bplus = zero, bminus = zero, cmax = _mm512_set1_pd(-kInf);
  __mmask8 bad_c = 0, infinite = 0;
  for (int64_t t = 0; t < s; t += 8) {
    const __mmask8 live = static_cast<__mmask8>((1u << std::min<int64_t>(8, s - t)) - 1u);
    const __m512d pv = _mm512_div_pd(_mm512_mul_pd(_mm512_maskz_loadu_pd(live, p + t), inv),
                                     total);
    _mm512_mask_storeu_pd(p + t, live, pv);
    const __m512d cv = _mm512_maskz_loadu_pd(live, c + t);
    bad_c |= _mm512_mask_cmp_pd_mask(live, cv, zero, _CMP_NGE_UQ);
    // finite: c - c == 0 (inf - inf and NaN are NaN)
    const __mmask8 fin = _mm512_mask_cmp_pd_mask(live, _mm512_sub_pd(cv, cv), zero,
                                                 _CMP_EQ_OQ);
    infinite |= static_cast<__mmask8>(live & ~fin);
    cmax = _mm512_mask_max_pd(cmax, fin, cmax, cv);
    const __mmask8 pos = _mm512_mask_cmp_pd_mask(live, pv, zero, _CMP_GT_OQ);
    if (pos) {
      u.positive += __builtin_popcount(pos);
      const __m512d cs = _mm512_maskz_mov_pd(pos, cv);
      bplus = _mm512_mask_add_pd(bplus, pos, bplus,
                                 _mm512_mul_pd(pv, Sleef_expm1d8_u10(cs)));
      bminus = _mm512_mask_add_pd(bminus, pos, bminus,
                                  _mm512_mul_pd(pv, Sleef_expm1d8_u10(_mm512_sub_pd(zero, cs))));
    }
  }
  u.bplus = _mm512_reduce_add_pd(bplus);
  u.bminus = _mm512_reduce_add_pd(bminus);
  u.cmax_finite = _mm512_reduce_max_pd(cmax);
  u.c_ok = bad_c == 0;
  u.all_finite = infinite == 0;
  return finish(p, c, s, u);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
tv_meter_rows(const at::Tensor& logits, const at::Tensor& bound, const at::Tensor& mask,
              bool vectorized) {
  TORCH_CHECK(logits.dim() == 4 && logits.scalar_type() == at::kDouble,
              "logits must be [N, H, M, S] float64");
  TORCH_CHECK(bound.sizes() == logits.sizes() && bound.scalar_type() == at::kDouble,
              "bound must be float64 of the logits' shape");
  const int64_t n = logits.size(0), h = logits.size(1), m = logits.size(2),
                s = logits.size(3);
  TORCH_CHECK(mask.dim() == 3 && mask.scalar_type() == at::kBool && mask.size(0) == n &&
                  mask.size(2) == s && mask.size(1) > 0 && m % mask.size(1) == 0,
              "mask must be [N, Q, S] bool, Q dividing the logits' rows");
  TORCH_CHECK(s > 0, "every row needs a token");
  const int64_t qn = mask.size(1);
  const auto lc = logits.contiguous();
  const auto bc = bound.contiguous();
  const auto mc = mask.contiguous();
  const auto f64 = logits.options();
  auto la = at::empty({n, h, m}, f64), lm = at::empty({n, h, m}, f64),
       cmax = at::empty({n, h, m}, f64);
  auto positive = at::empty({n, h, m}, f64.dtype(at::kLong));
  auto p_ok = at::empty({n, h, m}, mc.options()), c_ok = at::empty({n, h, m}, mc.options());
  const double* lp = lc.data_ptr<double>();
  const double* bp = bc.data_ptr<double>();
  const bool* mp = mc.data_ptr<bool>();
  double* lap = la.data_ptr<double>();
  double* lmp = lm.data_ptr<double>();
  double* cp = cmax.data_ptr<double>();
  int64_t* pp = positive.data_ptr<int64_t>();
  bool* pok = p_ok.data_ptr<bool>();
  bool* cok = c_ok.data_ptr<bool>();
  const bool avx512 = vectorized && __builtin_cpu_supports("avx512f");
  at::parallel_for(0, n * h * m, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> p(s);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row / (h * m), q = row % m % qn;
      const bool* seen = mp + (i * qn + q) * s;
      const Row r = avx512 ? row_avx512(lp + row * s, bp + row * s, seen, s, p.data())
                           : row_portable(lp + row * s, bp + row * s, seen, s, p.data());
      lap[row] = r.la, lmp[row] = r.lm, cp[row] = r.cmax, pp[row] = r.positive;
      pok[row] = r.p_ok, cok[row] = r.c_ok;
    }
  });
  return {la, lm, cmax, positive, p_ok, c_ok};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(witcert_fused, m) {
  m.def("tv_meter_rows(Tensor logits, Tensor bound, Tensor mask, bool vectorized) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(witcert_fused, CPU, m) {
  m.impl("tv_meter_rows", &tv_meter_rows);
}
