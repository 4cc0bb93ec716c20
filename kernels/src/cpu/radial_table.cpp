// cpu/radial_table.cpp: builds the cubic Hermite tables in r (ops/radial_table.h) of a radial
// MLP and of mace's edge density.
//
// Knot values and derivatives come from the MLP in double, differentiated in forward
// mode (tangent dH/dr carried through each layer), or from the density's exact formula. The
// step is halved until the error at every interval's midpoint (where the Hermite value error
// peaks; for the density also where its slope error peaks) is below kValueTolerance for each
// output and kGradTolerance for its r-derivative, each relative to the largest magnitude of that
// output (or derivative) over the knots.
#include "ops/radial_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/typed_plan.h"
#include "e3fuse/error.h"
#include "ops/activation.h"
#include "ops/radial.h"
#include "ops/radial_mlp.h"

namespace e3fuse::cpu {

namespace {

constexpr double kValueTolerance = 1e-7;  // float32 rounding is 6e-8
constexpr double kGradTolerance = 1e-6;
constexpr int kFirstIntervals = 256;
constexpr int kMaxIntervals = 8192;

// R(r) and dR/dr of the MLP at each r, row-major [points][outputs].
struct Samples {
  std::vector<double> value, grad;
};

// r0: the species pair's r_0 under a MACE distance transform (ignored without one).
// With `rmlp` (mace's RadialMLP, non-linear block) that network of the ordered species pair
// `pair` replaces `mlp`.
Samples evaluate(const ModelPlan& model, const MlpPlan& mlp, const std::vector<double>& rs,
                 double r0, const RadialMlpPlan* rmlp = nullptr, int pair = 0) {
  const int n = static_cast<int>(rs.size());
  const int layers = static_cast<int>(mlp.weights.size());
  const int nb = model.radial.num_basis;
  const std::vector<int>& dims = rmlp ? rmlp->dims : mlp.dims;
  if (dims.empty() || dims[0] != nb)
    throw Error("internal: radial MLP input does not match the radial basis");
  const ops::EnvelopeParams env{model.radial.envelope, model.radial.r_cut, model.radial.r_on,
                                model.radial.p};
  const RadialPlan& rp = model.radial;
  const bool mace_embedding = rp.pair_dependent() || !rp.apply_cutoff;
  const ops::TransformParams tp{rp.transform, rp.agnesi_q, rp.agnesi_p, rp.agnesi_a, rp.soft_alpha};
  std::vector<double> h(static_cast<size_t>(n) * nb), dh(h.size()), cut(n, 1.0), dcut(n, 0.0);
#pragma omp parallel for schedule(static)
  for (int p = 0; p < n; ++p) {
    if (mace_embedding)
      ops::mace_edge_embedding<double>(nb, rp.coeffs.data(), rp.prefactor, env, tp, rp.apply_cutoff,
                                       rs[p], r0, &h[static_cast<size_t>(p) * nb],
                                       &dh[static_cast<size_t>(p) * nb], cut[p], dcut[p]);
    else
      ops::edge_embedding<double>(nb, rp.coeffs.data(), rp.prefactor, env, rs[p],
                                  &h[static_cast<size_t>(p) * nb],
                                  &dh[static_cast<size_t>(p) * nb]);
  }
  if (rmlp) {  // per point through ops::radial_mlp_forward (tangent mode)
    std::vector<double> params;
    ops::RadialMlpView view = ops::radial_mlp_layout(*rmlp, params);
    if (view.layers == 0) throw Error("radial MLP with too many layers");
    view.params = params.data();
    const int W = dims.back();
    std::vector<double> out(static_cast<size_t>(n) * W), dout(out.size());
#pragma omp parallel
    {
      std::vector<double> work(4 * static_cast<size_t>(view.max_dim));
#pragma omp for schedule(static)
      for (int p = 0; p < n; ++p)
        ops::radial_mlp_forward(view, pair, &h[static_cast<size_t>(p) * nb],
                                &dh[static_cast<size_t>(p) * nb], &out[static_cast<size_t>(p) * W],
                                &dout[static_cast<size_t>(p) * W], work.data());
    }
    h.swap(out);
    dh.swap(dout);
  }
  for (int l = 0; l < (rmlp ? 0 : layers); ++l) {
    const int K = mlp.dims[l], N = mlp.dims[l + 1];
    const double* W = mlp.weights[l].data();
    std::vector<double> z(static_cast<size_t>(n) * N, 0.0), dz(z.size(), 0.0);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < n; ++p) {
      double* zp = &z[static_cast<size_t>(p) * N];
      double* dzp = &dz[static_cast<size_t>(p) * N];
      for (int k = 0; k < K; ++k) {
        const double a = h[static_cast<size_t>(p) * K + k], da = dh[static_cast<size_t>(p) * K + k];
        const double* w = W + static_cast<size_t>(k) * N;
        for (int c = 0; c < N; ++c) {
          zp[c] += a * w[c];
          dzp[c] += da * w[c];
        }
      }
      if (l + 1 < layers)
        for (int c = 0; c < N; ++c) {
          const double s = mlp.act_scale;
          dzp[c] *= ops::activation_grad(mlp.act, zp[c]) * s;
          zp[c] = ops::activation(mlp.act, zp[c]) * s;
        }
    }
    h.swap(z);
    dh.swap(dz);
  }
  if (!rp.apply_cutoff) {  // R = MLP(emb) f(r)
    const int W = dims.back();
    for (int p = 0; p < n; ++p)
      for (int c = 0; c < W; ++c) {
        const size_t q = static_cast<size_t>(p) * W + c;
        dh[q] = dh[q] * cut[p] + h[q] * dcut[p];
        h[q] *= cut[p];
      }
  }
  return {std::move(h), std::move(dh)};
}

// The cubic on [r_i, r_i + step] in t = (r - r_i) / step that matches values f0, f1 and
// slopes (times step) m0, m1 at both ends, as ops::radial_table_value reads it.
void hermite(double f0, double f1, double m0, double m1, double c[4]) {
  c[0] = f0;
  c[1] = m0;
  c[2] = 3.0 * (f1 - f0) - 2.0 * m0 - m1;
  c[3] = 2.0 * (f0 - f1) + m0 + m1;
}

// The smallest |r| a level of step `step` evaluates the MLP at: r = 0 itself is 0 / 0.
double smallest_radius(double step) { return 1e-4 * step; }

// One level of the refinement: its grid, knots and which intervals meet the tolerances.
struct Level {
  int intervals = 0;
  double origin = 0.0, step = 0.0;
  Samples knots;
  std::vector<double> vmax, gmax;  // per output: the largest |R_w| and |dR_w/dr| at the knots
  // per interval: the largest relative errors found at the checked points (the midpoint; with
  // slope_peaks also the slope's peaks), and of the slope at its peaks for a coarse tail
  std::vector<double> verr, gerr, peak_gerr;
  bool passes(int i) const { return verr[i] <= kValueTolerance && gerr[i] <= kGradTolerance; }
  bool passes_everywhere(int i) const { return passes(i) && peak_gerr[i] <= kGradTolerance; }
};

// The table of `outputs` functions of r over [0, cutoff] whose values and derivatives at
// any set of points `evaluate` gives (Samples, [points][outputs]): the step is halved from
// min_intervals (at least kFirstIntervals) until the Hermite cubic's error is below the
// tolerances. Its leading error, f''''(r) h^4 t^2 (1 - t)^2 / 24 on an interval, peaks at
// t = 1/2 for the value; for the slope (the t-derivative over h) it vanishes at t = 1/2
// and peaks at t = 1/2 +- 1/(2 sqrt 3). slope_peaks also checks both there (else only at
// t = 1/2, where the slope's error is of the next order).
//
// Coarse tail, when the one-step table would take more than coarse_tail_above bytes in
// float32: an MLP's fourth derivative is largest at small r (below 0.5 A for SevenNet's
// layers, closer than atoms come), so the finest step is kept only up to the radius past which
// a coarser level (evaluated on the way) meets the tolerances on every interval, the slope's
// also at its error's peaks, and that level's intervals follow (ops::radial_table_locate): the
// coarser level that leaves the fewest intervals in all. The level that ends the refinement is
// the one a table without a coarse tail has.
template <class T, class Evaluate>
RadialTable<T> tabulate(const ModelPlan& model, int outputs, int min_intervals, bool slope_peaks,
                        size_t coarse_tail_above, Evaluate&& evaluate) {
  const double cutoff = model.cutoff;
  if (!(cutoff > 0.0)) throw Error("internal: radial table needs a positive cutoff");
  const int W = outputs;
  // The XPLOR envelope's second derivative jumps at r_on: the grid keeps a knot there
  // (elsewhere R is smooth). The grid starts at or just below r = 0. Every level's knots
  // contain the anchor, so a coarser level's knots are knots of the finer ones.
  const double anchor = model.radial.envelope == EnvelopeKind::xplor && model.radial.r_on > 0.0
                            ? model.radial.r_on
                            : 0.0;
  const double d = 0.5 / std::sqrt(3.0);
  const std::vector<double> slope_peak_points{0.5 - d, 0.5 + d};
  std::vector<double> checks{0.5};
  if (slope_peaks) checks.insert(checks.end(), slope_peak_points.begin(), slope_peak_points.end());
  const bool coarse_tail = coarse_tail_above != std::numeric_limits<size_t>::max();
  // The largest relative errors of each interval of level L at t into verr (value, if given)
  // and gerr (slope).
  auto check_at = [&](const Level& L, double t, std::vector<double>* verr,
                      std::vector<double>& gerr) {
    std::vector<double> mid(L.intervals);
    for (int i = 0; i < L.intervals; ++i)
      mid[i] = std::max(std::abs(L.origin + (i + t) * L.step), smallest_radius(L.step));
    const Samples mids = evaluate(mid);
    for (int i = 0; i < L.intervals; ++i) {
      const double mid_sign = L.origin + (i + t) * L.step < 0.0 ? -1.0 : 1.0;
      double vi = 0.0, gi = 0.0;
      for (int w = 0; w < W; ++w) {
        const size_t a = static_cast<size_t>(i) * W + w, b = a + W;
        double c[4];
        hermite(L.knots.value[a], L.knots.value[b], L.knots.grad[a] * L.step,
                L.knots.grad[b] * L.step, c);
        const double v = ops::radial_table_value(c, t);
        const double g = ops::radial_table_grad(c, t, 1.0 / L.step);
        if (L.vmax[w] > 0) vi = std::max(vi, std::abs(v - mids.value[a]) / L.vmax[w]);
        if (L.gmax[w] > 0) gi = std::max(gi, std::abs(g - mid_sign * mids.grad[a]) / L.gmax[w]);
      }
      if (verr) (*verr)[i] = std::max((*verr)[i], vi);
      gerr[i] = std::max(gerr[i], gi);
    }
  };
  int first = kFirstIntervals;
  while (first < min_intervals && first < kMaxIntervals) first *= 2;
  std::vector<Level> coarser;  // the levels before (coarse_tail)
  for (int level = first;; level *= 2) {
    Level L;
    const double step = cutoff / level;
    const double origin = anchor - std::ceil(anchor / step - 1e-9) * step;
    const int intervals = static_cast<int>(std::ceil((cutoff - origin) / step - 1e-9));
    L.step = step;
    L.origin = origin;
    L.intervals = intervals;
    // Near r = 0, R is even in r (sin(c r) / r; the envelope is flat to order >= 2), so a
    // knot at r < 0 takes the values at |r|, its slope negated. At r = 0 the formula is
    // 0 / 0 and its slope cancels digits: a knot within tiny of 0 takes the value just
    // above (off by O(tiny^2)) and slope 0, the exact limit.
    // A distance transform makes R(r) not even in r (it is smooth at 0, the knot there takes
    // the value and slope just above).
    const bool even = !model.radial.pair_dependent();
    const double tiny = smallest_radius(step);
    std::vector<double> rs(intervals + 1), sign(intervals + 1);
    for (int i = 0; i <= intervals; ++i) {
      const double r = origin + i * step;
      sign[i] = std::abs(r) < tiny ? (even ? 0.0 : 1.0) : r < 0.0 ? -1.0 : 1.0;
      rs[i] = std::max(std::abs(r), tiny);
    }
    L.knots = evaluate(rs);
    Samples& knots = L.knots;
    for (int i = 0; i <= intervals; ++i)
      for (int w = 0; w < W; ++w) knots.grad[static_cast<size_t>(i) * W + w] *= sign[i];
    L.vmax.assign(W, 0.0);
    L.gmax.assign(W, 0.0);
    for (int i = 0; i <= intervals; ++i)
      for (int w = 0; w < W; ++w) {
        L.vmax[w] = std::max(L.vmax[w], std::abs(knots.value[static_cast<size_t>(i) * W + w]));
        L.gmax[w] = std::max(L.gmax[w], std::abs(knots.grad[static_cast<size_t>(i) * W + w]));
      }
    L.verr.assign(intervals, 0.0);
    L.gerr.assign(intervals, 0.0);
    for (const double t : checks) check_at(L, t, &L.verr, L.gerr);
    bool all_pass = true;
    for (int i = 0; i < intervals; ++i) all_pass = all_pass && L.passes(i);
    if (!all_pass && level < kMaxIntervals) {
      if (coarse_tail) {  // up to 8 times the final step
        coarser.push_back(std::move(L));
        if (coarser.size() > 3) coarser.erase(coarser.begin());
      }
      continue;
    }

    // This level up to a coarser level's first knot past its last failing interval (none:
    // this level alone), then that coarser level's intervals.
    const Level* tail = nullptr;
    int tail_first = 0, fine = intervals, total = intervals;
    const size_t float32_bytes = static_cast<size_t>(intervals) * W * 4 * sizeof(float);
    if (float32_bytes <= coarse_tail_above) coarser.clear();
    for (Level& C : coarser) {  // the slope's peaks are checked only for a tail
      C.peak_gerr.assign(C.intervals, 0.0);
      for (const double t : slope_peak_points) check_at(C, t, nullptr, C.peak_gerr);
      int kept = C.intervals;
      while (kept > 0 && C.passes_everywhere(kept - 1)) --kept;  // [kept, C.intervals) pass
      const int f = static_cast<int>(std::llround((C.origin + kept * C.step - origin) / step));
      if (kept < C.intervals && f >= 1 && f + C.intervals - kept < total) {
        tail = &C;
        tail_first = kept;
        fine = f;
        total = f + C.intervals - kept;
      }
    }
    RadialTable<T> table;
    table.intervals = total;
    table.fine_intervals = fine;
    table.origin = origin;
    table.step = step;
    table.inv_step = 1.0 / step;
    table.coeffs.resize(static_cast<size_t>(total) * W * 4);
    // interval i of level `from` into slot `slot`, as the cubic in t' = ratio t (c_k / ratio^k)
    auto store = [&](const Level& from, int i, int slot, int ratio) {
      table.value_error = std::max(table.value_error, from.verr[i]);
      table.grad_error = std::max(table.grad_error, from.gerr[i]);  // at the checked points
      for (int w = 0; w < W; ++w) {
        const size_t a = static_cast<size_t>(i) * W + w, b = a + W;
        double c[4];
        hermite(from.knots.value[a], from.knots.value[b], from.knots.grad[a] * from.step,
                from.knots.grad[b] * from.step, c);
        double scale = 1.0;
        for (int q = 0; q < 4; ++q, scale /= ratio)
          table.coeffs[4 * (static_cast<size_t>(slot) * W + w) + q] = static_cast<T>(c[q] * scale);
      }
    };
    for (int i = 0; i < fine; ++i) store(L, i, i, 1);
    if (tail) {
      const int ratio = static_cast<int>(std::llround(tail->step / step));
      while ((1 << table.coarse_shift) < ratio) ++table.coarse_shift;
      for (int k = tail_first; k < tail->intervals; ++k)
        store(*tail, k, fine + k - tail_first, ratio);
    }
    return table;
  }
}

}  // namespace

template <class T>
RadialTable<T> make_radial_table(const ModelPlan& model, const MlpPlan& mlp, double r0,
                                 int min_intervals, const RadialMlpPlan* rmlp, int pair,
                                 size_t coarse_tail_above) {
  return tabulate<T>(
      model, rmlp ? rmlp->dims.back() : mlp.dims.back(), min_intervals, false, coarse_tail_above,
      [&](const std::vector<double>& rs) { return evaluate(model, mlp, rs, r0, rmlp, pair); });
}

// mace's edge density tanh((w . emb)^2) (x f(r) without apply_cutoff), evaluated as the
// exact density passes do (ops::edge_density on the embedding, in double).
template <class T>
RadialTable<T> make_density_table(const ModelPlan& model, const std::vector<double>& weights,
                                  double r0, int min_intervals) {
  const RadialPlan& rp = model.radial;
  const int nb = rp.num_basis;
  if (static_cast<int>(weights.size()) != nb)
    throw Error("internal: density weights do not match the radial basis");
  const ops::EnvelopeParams env{rp.envelope, rp.r_cut, rp.r_on, rp.p};
  const ops::TransformParams tp{rp.transform, rp.agnesi_q, rp.agnesi_p, rp.agnesi_a, rp.soft_alpha};
  const bool mace_embedding = rp.pair_dependent() || !rp.apply_cutoff;
  auto density = [&](const std::vector<double>& rs) {
    const int n = static_cast<int>(rs.size());
    Samples s{std::vector<double>(n), std::vector<double>(n)};
#pragma omp parallel for schedule(static)
    for (int p = 0; p < n; ++p) {
      std::vector<double> emb(nb), demb(nb);
      double f = 1.0, df = 0.0;
      if (mace_embedding)
        ops::mace_edge_embedding<double>(nb, rp.coeffs.data(), rp.prefactor, env, tp,
                                         rp.apply_cutoff, rs[p], r0, emb.data(), demb.data(), f,
                                         df);
      else
        ops::edge_embedding<double>(nb, rp.coeffs.data(), rp.prefactor, env, rs[p], emb.data(),
                                    demb.data());
      ops::edge_density<double>(nb, weights.data(), emb.data(), demb.data(), rp.apply_cutoff, f, df,
                                s.value[p], s.grad[p]);
    }
    return s;
  };
  return tabulate<T>(model, 1, min_intervals, true, std::numeric_limits<size_t>::max(), density);
}

template RadialTable<float> make_radial_table<float>(const ModelPlan&, const MlpPlan&, double, int,
                                                     const RadialMlpPlan*, int, size_t);
template RadialTable<double> make_radial_table<double>(const ModelPlan&, const MlpPlan&, double,
                                                       int, const RadialMlpPlan*, int, size_t);
template RadialTable<float> make_density_table<float>(const ModelPlan&, const std::vector<double>&,
                                                      double, int);
template RadialTable<double> make_density_table<double>(const ModelPlan&,
                                                        const std::vector<double>&, double, int);

}  // namespace e3fuse::cpu
