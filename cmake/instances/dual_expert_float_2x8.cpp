// A compile-time shape the project's tests share: DualExpertAttention<float, 2, 8> (see cmake/instances.cmake).
#include <dea/attention/dual_expert.hpp>

template class dea::DualExpertAttention<float, 2, 8>;
