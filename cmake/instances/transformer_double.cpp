// The project's own programs and tests take TransformerModel<double> from here (see cmake/instances.cmake).
#include <dea/nn/transformer.hpp>

template class dea::nn::TransformerModel<double>;
