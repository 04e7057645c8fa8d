// The project's own programs and tests take the BERT classes in double from here (see cmake/instances.cmake).
#include <dea/bert/model.hpp>
#include <dea/bert/seq_cls.hpp>

template class dea::bert::BertSelfAttention<double>;
template class dea::bert::BertLayer<double>;
template class dea::bert::BertModel<double>;
template class dea::bert::BertForSequenceClassification<double>;
