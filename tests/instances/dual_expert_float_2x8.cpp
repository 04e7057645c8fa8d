// A compile-time shape the tests share: DualExpertAttention<float, 2, 8> (see tests/instances/dual_expert_shapes.hpp).
#include "dual_expert_shapes.hpp"

template class dea::DualExpertAttention<float, 2, 8>;
