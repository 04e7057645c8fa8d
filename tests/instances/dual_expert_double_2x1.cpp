// A compile-time shape the tests share: DualExpertAttention<double, 2, 1> (see tests/instances/dual_expert_shapes.hpp).
#include "dual_expert_shapes.hpp"

template class dea::DualExpertAttention<double, 2, 1>;
