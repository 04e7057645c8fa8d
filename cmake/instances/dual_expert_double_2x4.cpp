// A compile-time shape the project's tests share: DualExpertAttention<double, 2, 4> (see cmake/instances.cmake).
#include <dea/attention/dual_expert.hpp>

template class dea::DualExpertAttention<double, 2, 4>;
