// The double-precision orthogonal initialisation every scalar type shares (see dea/core/rng.hpp).
#include <dea/core/rng.hpp>

template Eigen::MatrixXd dea::init::detail::orthogonal_double<void>(dea::Index n, dea::Rng& rng);
