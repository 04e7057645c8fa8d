// tests/instances/dual_expert_shapes.hpp: the compile-time Dual-Expert shapes the tests share.
//
// Each of these instances costs the compiler about a minute, so the tests compile them once (the library
// dea_test_instances, cmake/instances.cmake) and a test that uses one includes this header instead of
// instantiating it again. They are not part of the library's interface.
#pragma once

#include <dea/attention/dual_expert.hpp>

#ifdef DEA_EXTERN_TEMPLATES
extern template class dea::DualExpertAttention<float, 2, 8>;
extern template class dea::DualExpertAttention<double, 2, 4>;
extern template class dea::DualExpertAttention<double, 2, 1>;
#endif
