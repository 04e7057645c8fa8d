// dea/nn/positional.hpp: the sinusoidal positional-encoding table (Vaswani et al. 2017, section 3.5).
//
// Shapes: table [max_len, D]; x [B*T, D] (row b*T + t) gets table row t added, T <= max_len.
//   angle(pos, i) = pos * exp(-2i * ln(10000) / D)
//   PE[pos, 2i] = sin(angle(pos, i)),   PE[pos, 2i + 1] = cos(angle(pos, i))
// The table is a constant: no parameters, no gradient (the backward of x + PE is the identity).
//
// Precision: the reference builds the table in float32 (torch.float) and only then converts the model to its
// working precision, so its float64 runs add float32-rounded values. `Precision::float32` (the default)
// reproduces that: each factor, product and sine/cosine is evaluated in float and the result widened.
// `Precision::exact` evaluates in double (rounded once to S).
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"

#include <cmath>

namespace dea {
namespace nn {

template <class S>
class SinusoidalPositionalEncoding {
public:
  enum class Precision { float32, exact };

  SinusoidalPositionalEncoding() = default;
  SinusoidalPositionalEncoding(Index max_len, Index d_model, Precision prec = Precision::float32)
      : table_(max_len, d_model), prec_(prec) {
    check(max_len > 0, "SinusoidalPositionalEncoding: max_len must be positive, got ", max_len);
    check(d_model > 0, "SinusoidalPositionalEncoding: d_model must be positive, got ", d_model);
    fill_table(table_.data(), max_len, d_model, prec);
  }

  /// Writes the table [max_len, d_model] (row-major) to `out` (e.g. a workspace: no allocation).
  static void fill_table(S* out, Index max_len, Index d_model, Precision prec = Precision::float32) {
    Eigen::Map<Mat<S>> t(out, max_len, d_model);
    for (Index c = 0; c < d_model; ++c) {
      const Index two_i = c - c % 2;
      if (prec == Precision::float32) {
        // div = exp(2i * (-ln(10000) / D)), all in float, as torch.arange(0, D, 2).float() * (-log(1e4)/D)
        const float scale = static_cast<float>(-std::log(10000.0) / static_cast<double>(d_model));
        const float div = std::exp(static_cast<float>(two_i) * scale);
        for (Index pos = 0; pos < max_len; ++pos) {
          const float a = static_cast<float>(pos) * div;
          t(pos, c) = static_cast<S>(c % 2 == 0 ? std::sin(a) : std::cos(a));
        }
      } else {
        const double div = std::exp(-static_cast<double>(two_i) * std::log(10000.0) / static_cast<double>(d_model));
        for (Index pos = 0; pos < max_len; ++pos) {
          const double a = static_cast<double>(pos) * div;
          t(pos, c) = static_cast<S>(c % 2 == 0 ? std::sin(a) : std::cos(a));
        }
      }
    }
  }

  Index max_len() const { return table_.rows(); }
  Index d_model() const { return table_.cols(); }
  Precision precision() const { return prec_; }
  /// The table [max_len, D].
  const Mat<S>& table() const { return table_; }
  /// Replaces the table (same shape), e.g. with a buffer exported from another implementation.
  void set_table(const Mat<S>& t) {
    check_matrix(t, table_.rows(), table_.cols(), "SinusoidalPositionalEncoding::set_table: table");
    table_ = t;
  }

  /// x [B*T, D] += PE[t] on row b*T + t. Throws unless x has batch*T rows with T <= max_len.
  void add_to(Mat<S>& x, Index batch) const {
    check(batch > 0 && x.rows() % batch == 0, "SinusoidalPositionalEncoding: x: expected batch*T rows with batch = ",
          batch, ", got ", x.rows());
    check(x.cols() == d_model(), "SinusoidalPositionalEncoding: x: expected ", d_model(), " columns, got ", x.cols());
    const Index T = x.rows() / batch;
    check(T <= max_len(), "SinusoidalPositionalEncoding: sequence length ", T, " exceeds max_len ", max_len());
    parallel_for(batch, [&](Index b) { x.middleRows(b * T, T) += table_.topRows(T); });  // x + PE[:T]
  }

private:
  Mat<S> table_;
  Precision prec_ = Precision::float32;
};

}  // namespace nn
}  // namespace dea
