// The logits rules and sampling of serving/decoding/rules.py, row by row, with the same float32 (and, where numpy
// works in float64, float64) operations in the same order, so that every value is the reference's bit for bit.
// Renormalization (a log-softmax) is not here: numpy's own exp and log are not libm's, so the search hands the rows
// to rules.py's _log_softmax between before_renormalize and after_renormalize (serving/decoding/native.py).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels.hpp"

namespace mtgate {

// The ids of a step's log-prob columns: every id (ids null: column i is id i), or a shortlist's sorted ids.
struct Columns {
    const int64_t* ids = nullptr;
    int64_t size = 0;

    // The column of an id, -1 when the step has none for it (base.py's column_index).
    int64_t of(int64_t id) const {
        if (ids == nullptr) return id >= 0 && id < size ? id : -1;
        const int64_t* at = std::lower_bound(ids, ids + size, id);
        return at != ids + size && *at == id ? at - ids : -1;
    }
    int64_t id(int64_t column) const { return ids == nullptr ? column : ids[column]; }
};

// SearchOptions, as the core reads them (serving/decoding/base.py).
struct Options {
    int64_t eos_id = 0;
    int64_t decoder_start_id = 0;
    int64_t beam_size = 1;
    bool gnmt = false;  // length_penalty_kind "gnmt": tensor2tensor's beam rules
    bool forced_eos = false;
    bool early_stopping = false;
    bool renormalize_logits = false;
    int64_t num_hypotheses = 1;
    int64_t min_length = 0;
    double repetition_penalty = 1.0;
    int64_t no_repeat_ngram_size = 0;
    std::vector<int64_t> bad_word_ids;
    bool sampling = false;
    double temperature = 1.0;
    int64_t top_k = 0;
    bool stream = false;  // an on_tokens hook wants the tokens

    bool needs_history() const {
        return repetition_penalty != 1.0 || no_repeat_ngram_size > 0 || min_length > 0;
    }
};

// What the rules read of one row: its generated tokens (the first `steps`) and its target prefix.
struct History {
    const int64_t* tokens;
    int64_t steps;
    const int64_t* prefix;
    int64_t prefix_len;
};

// The columns of the bad words at a step (base.py's bad_word_index).
inline std::vector<int64_t> bad_columns(const Options& options, const Columns& columns) {
    std::vector<int64_t> out;
    for (int64_t id : options.bad_word_ids) {
        const int64_t column = columns.of(id);
        if (column >= 0) out.push_back(column);
    }
    return out;
}

class Rules {
   public:
    Rules(const Options& options, const Columns& columns)
        : options_(options), columns_(columns), bad_(bad_columns(options, columns)), eos_(columns.of(options.eos_id)) {}

    // Every rule up to renormalization (rules.py's process): repetition penalty, no-repeat n-grams, bad words,
    // minimum length, forced EOS (`forced`: the row is at its last allowed step).
    void before_renormalize(float* row, const History& history, bool forced) {
        const int64_t width = columns_.size;
        if (options_.repetition_penalty != 1.0) penalize_repetitions(row, history);
        if (options_.no_repeat_ngram_size > 0) ban_repeated_ngrams(row, history);
        for (int64_t column : bad_) row[column] = kNegInf;
        if (options_.min_length > 0 && history.steps - history.prefix_len < options_.min_length && eos_ >= 0) {
            row[eos_] = kNegInf;
        }
        if (forced) {
            std::fill(row, row + width, kNegInf);
            if (eos_ >= 0) row[eos_] = 0.0f;
        }
    }

    // The rule after renormalization: a row inside its target prefix may only continue it.
    void after_renormalize(float* row, const History& history) const {
        if (history.steps >= history.prefix_len) return;
        std::fill(row, row + columns_.size, kNegInf);
        const int64_t column = columns_.of(history.prefix[history.steps]);
        if (column >= 0) row[column] = 0.0f;
    }

   private:
    // transformers' RepetitionPenaltyLogitsProcessor on log-probs: each seen column once, the start token included.
    void penalize_repetitions(float* row, const History& history) {
        seen_.clear();
        for (int64_t i = 0; i < history.steps; ++i) {
            const int64_t column = columns_.of(history.tokens[i]);
            if (column >= 0) seen_.push_back(column);
        }
        const int64_t start = columns_.of(options_.decoder_start_id);
        if (start >= 0) seen_.push_back(start);
        std::sort(seen_.begin(), seen_.end());
        seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
        const float penalty = static_cast<float>(options_.repetition_penalty);
        for (int64_t column : seen_) {
            const float score = row[column];
            row[column] = score < 0 ? score * penalty : score / penalty;
        }
    }

    // transformers' NoRepeatNGramLogitsProcessor over [start, tokens...].
    void ban_repeated_ngrams(float* row, const History& history) const {
        const int64_t n = options_.no_repeat_ngram_size;
        const int64_t length = history.steps + 1;
        if (length + 1 < n) return;
        auto at = [&](int64_t i) { return i == 0 ? options_.decoder_start_id : history.tokens[i - 1]; };
        const int64_t tail = length - n + 1;  // where the last n - 1 tokens start
        for (int64_t i = 0; i + n <= length; ++i) {
            bool same = true;
            for (int64_t j = 0; j < n - 1 && same; ++j) same = at(i + j) == at(tail + j);
            if (!same) continue;
            const int64_t column = columns_.of(at(i + n - 1));
            if (column >= 0) row[column] = kNegInf;
        }
    }

    const Options& options_;
    const Columns& columns_;
    std::vector<int64_t> bad_;
    int64_t eos_;
    std::vector<int64_t> seen_;
};

// --------------------------------------------------------------------------------------------- sampling

inline uint64_t splitmix64(uint64_t value) {
    uint64_t z = value + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// rules.py's uniform: a number in [0, 1) of the row's (seed, step) only.
inline double uniform(uint64_t seed, int64_t step) {
    const uint64_t mixed = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(step)));
    return static_cast<double>(mixed >> 11) / 9007199254740992.0;  // 2**53
}

// numpy's max of a float32 row: NaN if any entry is NaN.
inline float row_max(const float* row, int64_t width) {
    float best = row[0];
    for (int64_t i = 1; i < width; ++i) {
        if (row[i] > best || std::isnan(row[i])) best = row[i];
        if (std::isnan(best)) break;
    }
    return best;
}

// rules.py's warp (temperature, then top-k; not top-p: that option keeps the numpy search) and sample, for one row.
class Sampler {
   public:
    explicit Sampler(const Options& options) : options_(options) {}

    int64_t draw(const float* row, int64_t width, uint64_t seed, int64_t step) {
        warped_.resize(static_cast<size_t>(width));
        cumulative_.resize(static_cast<size_t>(width));
        float top = row_max(row, width);
        if (!std::isfinite(top)) top = 0.0f;
        for (int64_t i = 0; i < width; ++i) {
            const float shifted = row[i] - top;
            warped_[i] = static_cast<float>(static_cast<double>(shifted) / options_.temperature);
        }
        if (options_.top_k > 0 && options_.top_k < width) {
            kth_.assign(warped_.begin(), warped_.end());
            std::nth_element(kth_.begin(), kth_.begin() + (options_.top_k - 1), kth_.end(), std::greater<float>());
            const float kth = kth_[options_.top_k - 1];
            for (float& score : warped_) {
                if (score < kth) score = kNegInf;
            }
        }
        const float best = row_max(warped_.data(), width);
        double total = 0.0;
        int64_t last_allowed = width - 1;
        bool any = false;
        for (int64_t i = 0; i < width; ++i) {
            const float shifted = warped_[i] - best;
            const double probability = std::exp(static_cast<double>(shifted));
            total += probability;
            cumulative_[i] = total;
            if (probability > 0) {
                last_allowed = i;
                any = true;
            }
        }
        if (!any) last_allowed = width - 1;
        const double threshold = uniform(seed, step) * cumulative_[width - 1];
        int64_t chosen = 0;
        for (int64_t i = 0; i < width; ++i) chosen += cumulative_[i] <= threshold;
        return std::min(chosen, last_allowed);
    }

   private:
    const Options& options_;
    std::vector<float> warped_, kth_;
    std::vector<double> cumulative_;
};

}  // namespace mtgate
