// dea/attention/gate_stats.hpp: the gate-loss statistics of one Dual-Expert forward pass, a plain record that
// models, trainers and logs read without including the attention class itself.
#pragma once

#include "../core/config.hpp"

namespace dea {

/// Gate-loss statistics of one forward pass (the reference's `stats`).
struct GateStats {
  double loss_reg = 0;            ///< mean (alpha_hat - alpha)^2 over labelled cells (every head)
  double loss_spot = 0;           ///< mean l_pair over valid (b, h, i, p)
  double loss_decision = 0;       ///< mean L_decision over valid pairs
  double decision_side_acc = 0;   ///< fraction of valid pairs on the oracle's side of beta (NaN without pairs)
  Index n_decision_pairs = 0;     ///< number of valid pairs
  Index n_labelled = 0;           ///< number of labelled cells (counted once per head)
};

}  // namespace dea
