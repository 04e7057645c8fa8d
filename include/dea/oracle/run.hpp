// dea/oracle/run.hpp: an oracle run over a pairs file into an alpha cache that an interrupted run continues
// (`dea oracle`; formats in oracle/files.hpp).
//
// Recovery rule. The cache is written record by record in the pairs' order: each batch's lines are appended with one
// write and flushed to disk (fsync) before the next batch starts (core/append_file.hpp). So after a crash or a kill
// the file holds the records of pairs 0 .. n-1, complete, and possibly a torn piece of the next batch after the last
// newline. A new run with the same pairs file and --out:
//   1. reads the file and checks every complete line against the pairs: line i must be the record of pair i, byte
//      for byte as this program writes it (another pairs file, an edited or damaged line: an error, nothing touched);
//   2. computes the last complete record again and requires the same bytes, which catches a resume with other
//      models, another precision, other max lengths or another calibration (an error, nothing touched);
//   3. cuts the torn piece off (the bytes after the last newline) and goes on from pair n.
// Every record depends on its own pair alone, bit for bit (oracle/nli_oracle.hpp: each sequence runs alone), so the
// finished file is byte for byte the file an uninterrupted run writes, whatever the batch size or threads of
// either run. A complete file is left as it is (nothing to do).
//
//   const auto pairs = dea::io::read_oracle_pairs("pairs.jsonl");
//   const auto resume = dea::bert::prepare_oracle_resume(oracle, pairs, "pairs.jsonl", "cache.jsonl");
//   dea::bert::run_oracle(oracle, pairs, "cache.jsonl", resume, {}, [](const dea::bert::OracleProgress& p) { ... });
#pragma once

#include "../core/append_file.hpp"
#include "../core/error.hpp"
#include "files.hpp"
#include "nli_oracle.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dea {
namespace bert {

/// Settings of run_oracle.
struct OracleRunOptions {
  std::size_t batch_size = 128;  ///< pairs scored (over all threads) and appended per step
};

/// Where a run stands, after each batch.
struct OracleProgress {
  std::size_t done = 0;     ///< records in the file
  std::size_t total = 0;    ///< pairs
  std::size_t resumed = 0;  ///< records found at the start
  double seconds = 0;       ///< since this run started computing
};

/// What prepare_oracle_resume found in the output file.
struct OracleResume {
  std::size_t records = 0;         ///< complete, verified records: the run starts at this pair
  std::uint64_t keep_bytes = 0;    ///< their bytes
  std::uint64_t dropped_bytes = 0; ///< a torn record after them, cut off when the run starts
  bool exists = false;             ///< the output file existed
};

/// Applies steps 1 and 2 of the recovery rule (file comment) to `out_path`; an error when the file does not continue
/// this run. Nothing is written.
template <class S>
OracleResume prepare_oracle_resume(NliOracle<S>& oracle, const std::vector<io::OraclePair>& pairs,
                                   const std::string& pairs_path, const std::string& out_path) {
  const io::PartialCache pc = io::read_partial_cache(out_path, pairs, pairs_path);
  OracleResume r;
  r.exists = pc.exists;
  r.records = pc.records;
  r.keep_bytes = pc.good_bytes;
  r.dropped_bytes = pc.torn_bytes;
  if (pc.records > 0) {
    const io::OraclePair& p = pairs[pc.records - 1];
    const OracleScore s = oracle.score(p.premise, p.hypothesis);
    const std::string again = io::oracle_cache_line(p, s.alpha, s.alpha_raw, s.phi, s.sim);
    if (again != pc.last_record) {
      std::string was = pc.last_record, now = again;
      was.pop_back();
      now.pop_back();
      ::dea::detail::raise(::dea::detail::concat(
          out_path, ":", pc.records, ": this record, computed again, differs from the one in the file (file: ", was,
          "; now: ", now, "): the file was written with other models, another precision (--float / --double / "
          "--precision), other max lengths or another calibration. Resume with the same settings, or remove it to "
          "start again"));
    }
  }
  return r;
}

/// Scores pairs [resume.records, end) in batches and appends their records to `out_path` (step 3 of the recovery
/// rule first). `on_batch(OracleProgress)` is called after each batch is on disk. Returns the final progress.
template <class S, class OnBatch>
OracleProgress run_oracle(NliOracle<S>& oracle, const std::vector<io::OraclePair>& pairs, const std::string& out_path,
                          const OracleResume& resume, const OracleRunOptions& opt, OnBatch&& on_batch) {
  check(opt.batch_size >= 1, "run_oracle: batch_size must be >= 1");
  check(resume.records <= pairs.size(), "run_oracle: the resume point (", resume.records, ") is past the ",
        pairs.size(), " pairs");
  OracleProgress pr;
  pr.total = pairs.size();
  pr.resumed = resume.records;
  pr.done = resume.records;
  if (resume.records == pairs.size() && resume.dropped_bytes == 0 && resume.exists) return pr;  // nothing to do
  AppendFile out(out_path, resume.keep_bytes);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<TextPair> batch;
  std::string lines;
  for (std::size_t b0 = resume.records; b0 < pairs.size(); b0 += opt.batch_size) {
    const std::size_t b1 = std::min(pairs.size(), b0 + opt.batch_size);
    batch.clear();
    for (std::size_t i = b0; i < b1; ++i) batch.push_back({pairs[i].premise, pairs[i].hypothesis});
    const std::vector<OracleScore> s = oracle.score(batch);
    lines.clear();
    for (std::size_t i = b0; i < b1; ++i) {
      const OracleScore& x = s[i - b0];
      lines += io::oracle_cache_line(pairs[i], x.alpha, x.alpha_raw, x.phi, x.sim);
    }
    out.append(lines);
    pr.done = b1;
    pr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    on_batch(static_cast<const OracleProgress&>(pr));
  }
  return pr;
}

}  // namespace bert
}  // namespace dea
