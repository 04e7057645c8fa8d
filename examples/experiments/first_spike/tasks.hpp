// examples/experiments/first_spike/tasks.hpp: the benchmark's data sets and reference predictors.
//
// RE-CREATION (the seed's data module is not public; these generators fit its experiment script, with the draw
// orders of the PyTorch re-creation):
//   'sequence'        noisy next-step forecasting: a sum of two sinusoids plus an offset, N(0, 0.1^2) noise on
//                     every point; x = points 0..31, y = point 32.
//   'sequence_recall' key/value retrieval: positions 2i, 2i+1 hold key K_i (one of 8 levels) and value V_i; position
//                     30 is a separator, 31 the query key Q = K_j; y = V_i of the largest i with K_i == Q;
//                     N(0, 0.05^2) noise on every token and on the target.
// Both: n_train + n_test examples drawn from one generator seeded with the run's seed (the first n_train are
// the training set), then normalised with one scalar mean and std (ddof 0) of the training inputs, applied to
// inputs and targets alike; float32. The generator here is dea::Rng, not NumPy's default_rng, so the draws
// differ from the PyTorch re-creation's; the anchor file (--anchor) carries that re-creation's exact data.
#pragma once

#include <dea/core/error.hpp>
#include <dea/core/rng.hpp>
#include <dea/core/tensor.hpp>
#include <dea/io/safetensors.hpp>

#include <Eigen/Cholesky>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lapbench {

using dea::Index;
using MatF = dea::Mat<float>;
using MatD = dea::Mat<double>;
constexpr double kPi = 3.14159265358979323846;

struct TaskData {
  std::string task;
  std::uint64_t seed = 0;
  MatF xtr, ytr, xte, yte;  ///< [n_train, win], [n_train, 1], [n_test, win], [n_test, 1], normalised
  double mu = 0, sd = 1;    ///< the normalisation (raw = normalised * sd + mu)
  double noise_floor_mse = 0;
  std::string source = "generated (dea::Rng)";
  Index win() const { return xtr.cols(); }
};

inline void normalise(TaskData& d, const MatD& xtr, const MatD& ytr, const MatD& xte, const MatD& yte,
                      double noise_sd) {
  d.mu = xtr.mean();
  d.sd = std::sqrt((xtr.array() - d.mu).square().mean());
  auto norm = [&](const MatD& m) { return ((m.array() - d.mu) / d.sd).matrix().cast<float>().eval(); };
  d.xtr = norm(xtr);
  d.ytr = norm(ytr);
  d.xte = norm(xte);
  d.yte = norm(yte);
  d.noise_floor_mse = noise_sd * noise_sd / (d.sd * d.sd);
}

/// 'sequence': draw order f (n,2), phi (n,2), A (n,2), c (n,1), noise (n,33), each row-major over examples.
inline TaskData make_sequence(std::uint64_t seed, Index n_train, Index n_test) {
  const Index n = n_train + n_test, len = 33, win = 32;
  dea::Rng rng(seed);
  MatD f(n, 2), phi(n, 2), A(n, 2), c(n, 1), noise(n, len);
  for (Index i = 0; i < f.size(); ++i) f.data()[i] = rng.uniform(1.0 / 32.0, 1.0 / 4.0);
  for (Index i = 0; i < phi.size(); ++i) phi.data()[i] = rng.uniform(0.0, 2.0 * kPi);
  for (Index i = 0; i < A.size(); ++i) A.data()[i] = rng.uniform(0.5, 1.0);
  for (Index i = 0; i < c.size(); ++i) c.data()[i] = rng.uniform(-0.5, 0.5);
  for (Index i = 0; i < noise.size(); ++i) noise.data()[i] = rng.normal(0.0, 0.1);
  MatD obs(n, len);
  for (Index e = 0; e < n; ++e)
    for (Index t = 0; t < len; ++t) {
      double s = c(e, 0);
      for (int k = 0; k < 2; ++k) s += A(e, k) * std::sin(2.0 * kPi * f(e, k) * double(t) + phi(e, k));
      obs(e, t) = s + noise(e, t);
    }
  TaskData d;
  d.task = "sequence";
  d.seed = seed;
  normalise(d, obs.topLeftCorner(n_train, win), obs.block(0, win, n_train, 1), obs.bottomLeftCorner(n_test, win),
            obs.block(n_train, win, n_test, 1), 0.1);
  return d;
}

/// 'sequence_recall': draw order key_idx (n,15) in 0..7, vals U(-1,1) (n,15), j (n) in 0..14, noise_x (n,32),
/// noise_y (n,1).
inline TaskData make_sequence_recall(std::uint64_t seed, Index n_train, Index n_test) {
  const Index n = n_train + n_test, pairs = 15, win = 32;
  const double noise_sd = 0.05;
  dea::Rng rng(seed);
  std::vector<int> key_idx(static_cast<std::size_t>(n * pairs)), j(static_cast<std::size_t>(n));
  MatD vals(n, pairs), nx(n, win), ny(n, 1);
  for (auto& k : key_idx) k = static_cast<int>(rng.below(8));
  for (Index i = 0; i < vals.size(); ++i) vals.data()[i] = rng.uniform(-1.0, 1.0);
  for (auto& q : j) q = static_cast<int>(rng.below(pairs));
  for (Index i = 0; i < nx.size(); ++i) nx.data()[i] = rng.normal(0.0, noise_sd);
  for (Index i = 0; i < ny.size(); ++i) ny.data()[i] = rng.normal(0.0, noise_sd);
  MatD x(n, win), y(n, 1);
  auto level = [](int m) { return -1.0 + 2.0 * m / 7.0; };
  for (Index e = 0; e < n; ++e) {
    const int* ki = &key_idx[static_cast<std::size_t>(e * pairs)];
    for (Index i = 0; i < pairs; ++i) {
      x(e, 2 * i) = level(ki[i]);
      x(e, 2 * i + 1) = vals(e, i);
    }
    const int q = ki[j[static_cast<std::size_t>(e)]];
    x(e, 30) = 0.0;
    x(e, 31) = level(q);
    Index last = -1;
    for (Index i = 0; i < pairs; ++i)
      if (ki[i] == q) last = i;
    y(e, 0) = vals(e, last) + ny(e, 0);
    x.row(e) += nx.row(e);
  }
  TaskData d;
  d.task = "sequence_recall";
  d.seed = seed;
  normalise(d, x.topRows(n_train), y.topRows(n_train), x.bottomRows(n_test), y.bottomRows(n_test), noise_sd);
  return d;
}

inline TaskData make_task(const std::string& task, std::uint64_t seed, Index n_train, Index n_test) {
  if (task == "sequence") return make_sequence(seed, n_train, n_test);
  if (task == "sequence_recall") return make_sequence_recall(seed, n_train, n_test);
  dea::detail::raise("--task: expected 'sequence' or 'sequence_recall', got '" + task + "'");
}

/// The PyTorch re-creation's exact data of one seed from an anchor file (data/s<seed>/{xtr,ytr,xte,yte,norm}).
inline TaskData load_anchor_task(const dea::io::SafeTensors& st, const std::string& task, std::uint64_t seed,
                                 const std::string& path) {
  const std::string p = "data/s" + std::to_string(seed) + "/";
  dea::check(st.has(p + "xtr"), "--anchor ", path, ": no data for seed ", seed, " (expected tensor '", p, "xtr')");
  auto mat = [&](const std::string& name) {
    const dea::Tensor<float> t = st.get<float>(p + name);
    dea::check(t.dim() == 2, "--anchor ", path, ": ", p + name, ": expected 2 dimensions, got ",
               dea::shape_str(t.shape));
    MatF m(t.size(0), t.size(1));
    std::copy(t.ptr(), t.ptr() + t.numel(), m.data());
    return m;
  };
  TaskData d;
  d.task = task;
  d.seed = seed;
  d.xtr = mat("xtr");
  d.ytr = mat("ytr");
  d.xte = mat("xte");
  d.yte = mat("yte");
  const dea::Tensor<double> norm = st.get<double>(p + "norm");
  dea::check(norm.numel() == 2, "--anchor ", path, ": ", p, "norm: expected 2 values");
  d.mu = norm[0];
  d.sd = norm[1];
  const double noise_sd = task == "sequence" ? 0.1 : 0.05;
  d.noise_floor_mse = noise_sd * noise_sd / (d.sd * d.sd);
  d.source = "anchor " + path;
  dea::check(d.xtr.rows() == d.ytr.rows() && d.xte.rows() == d.yte.rows() && d.xtr.cols() == d.xte.cols(),
             "--anchor ", path, ": inconsistent shapes for seed ", seed);
  return d;
}

// ---------------------------------------------------------------------------------------------------------------
// Reference predictors (test MSE in normalised units)

inline double mse(const MatD& pred, const MatF& y) {
  return (pred - y.cast<double>()).array().square().mean();
}

/// Predicts the training-target mean.
inline double mean_predictor_mse(const TaskData& d) {
  const double m = d.ytr.cast<double>().mean();
  return mse(MatD::Constant(d.yte.rows(), 1, m), d.yte);
}

/// Predicts the last input.
inline double persistence_mse(const TaskData& d) { return mse(d.xte.rightCols(1).cast<double>(), d.yte); }

/// Ridge regression on the win inputs plus an (unpenalised) intercept; lambda chosen by exact leave-one-out
/// error on the training set from {1e-4, 1e-3, ..., 100}. Returns the test MSE and the chosen lambda.
inline double ridge_mse(const TaskData& d, double* chosen_lambda = nullptr) {
  const MatD X = d.xtr.cast<double>(), Xt = d.xte.cast<double>();
  const Eigen::VectorXd y = d.ytr.cast<double>().col(0);
  const Eigen::RowVectorXd xm = X.colwise().mean();
  const double ym = y.mean();
  const MatD Xc = X.rowwise() - xm;
  const Eigen::VectorXd yc = y.array() - ym;
  const double n = double(X.rows());
  double best = std::numeric_limits<double>::infinity(), best_lambda = 0;
  Eigen::VectorXd best_beta;
  for (double lambda = 1e-4; lambda <= 100.0 * 1.0001; lambda *= 10.0) {
    MatD G = Xc.transpose() * Xc;
    G.diagonal().array() += lambda;
    const Eigen::LDLT<MatD> ldlt(G);
    const Eigen::VectorXd beta = ldlt.solve(Xc.transpose() * yc);
    // hat matrix diagonal (with the intercept): h_i = x_ci^T G^-1 x_ci + 1/n
    const MatD GiXt = ldlt.solve(Xc.transpose());
    double loo = 0;
    for (Index i = 0; i < X.rows(); ++i) {
      const double h = Xc.row(i).dot(GiXt.col(i)) + 1.0 / n;
      const double r = yc[i] - Xc.row(i).dot(beta);
      loo += (r / (1.0 - h)) * (r / (1.0 - h));
    }
    if (loo < best) {
      best = loo;
      best_lambda = lambda;
      best_beta = beta;
    }
  }
  if (chosen_lambda) *chosen_lambda = best_lambda;
  const MatD pred = ((Xt.rowwise() - xm) * best_beta).array() + ym;
  return mse(pred, d.yte);
}

}  // namespace lapbench
