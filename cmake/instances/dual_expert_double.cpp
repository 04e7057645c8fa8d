// The project's own programs and tests take DualExpertAttention<double> from here (see cmake/instances.cmake).
#include <dea/attention/dual_expert.hpp>

template class dea::DualExpertAttention<double>;
