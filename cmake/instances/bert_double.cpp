// The project's own programs and tests take the BERT classes in double from here (see cmake/instances.cmake), and
// DualExpertBert<double> with the BERT encoder around its Dual-Expert adapters (whose kernels are the
// DualExpertAttention<double> instance). One translation unit for both: they share most of their instantiations (the
// Linear, LayerNorm and embedding kernels), which a second unit would compile again: with DualExpertBert this unit
// takes 45 s of compiler time (g++ 12, -O3), 8 s more than without it, where a unit of its own took 38 s.
#include <dea/bert/dual_expert_bert.hpp>
#include <dea/bert/model.hpp>
#include <dea/bert/seq_cls.hpp>

template class dea::bert::BertSelfAttention<double>;
template class dea::bert::BertLayer<double>;
template class dea::bert::BertModel<double>;
template class dea::bert::BertForSequenceClassification<double>;

template class dea::bert::BertLayer<double, dea::DualExpertAttention<double>>;
template class dea::bert::BertModel<double, dea::DualExpertAttention<double>>;
template class dea::bert::DualExpertBert<double>;
