// The double-precision orthogonal initialisation every scalar type shares (see dea/core/init.hpp).
#include <dea/core/init.hpp>

template Eigen::MatrixXd dea::init::detail::orthogonal_double<void>(dea::Index n, dea::Rng& rng);
