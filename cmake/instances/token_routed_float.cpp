// The project's own programs and tests take TokenRoutedAttention<float> from here (see cmake/instances.cmake).
#include <dea/attention/token_routed.hpp>

template class dea::TokenRoutedAttention<float>;
