// The project's own programs and tests take TransformerModel<float> from here (see cmake/instances.cmake).
#include <dea/nn/transformer.hpp>

template class dea::nn::TransformerModel<float>;
