// The project's own programs and tests take the BERT classes in float from here (see cmake/instances.cmake).
#include <dea/bert/model.hpp>
#include <dea/bert/seq_cls.hpp>

template class dea::bert::BertSelfAttention<float>;
template class dea::bert::BertLayer<float>;
template class dea::bert::BertModel<float>;
template class dea::bert::BertForSequenceClassification<float>;
