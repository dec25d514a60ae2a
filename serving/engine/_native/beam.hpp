// Beam search, both rule sets of serving/decoding/beam.py: transformers' (HFBeamSearch) and tensor2tensor's
// (T2TBeamSearch). Rows are sentence * K + beam; each sentence counts its own steps. Scores are float32 and every
// operation is the reference's, in its order; the length penalties come from tables numpy computed (native.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "kernels.hpp"
#include "rules.hpp"
#include "step.hpp"

namespace mtgate {

constexpr float kHFMask = -1.0e9f;   // transformers masks with -1e9
constexpr float kT2TInf = 1.0e7f;    // tensor2tensor's INF

class Beam {
   public:
    struct Sentence {
        int64_t id, cap, steps = 0;
        std::vector<int64_t> prefix;
        std::vector<int64_t> alive, finished;  // [K, cap] token sequences (only the first steps + 1 / len count)
        std::vector<int64_t> finished_len, parents;
        std::vector<char> finished_flag;
        std::vector<float> alive_scores, finished_scores;
        bool improvable = true;  // HF
        int64_t stable = 0;      // streaming: the length of the stable prefix reported so far
    };

    // ``penalty[g]``: the length penalty of g generated tokens as _advance computes it (float32); ``normalizer[g]``:
    // as _normalized computes it for an alive alternative.
    Beam(Options options, std::vector<Sentence> sentences, std::vector<float> penalty, std::vector<float> normalizer)
        : options_(std::move(options)),
          k_(options_.beam_size),
          sentences_(std::move(sentences)),
          penalty_(std::move(penalty)),
          normalizer_(std::move(normalizer)) {
        const float mask = options_.gnmt ? -kT2TInf : kHFMask;
        for (Sentence& s : sentences_) {
            s.alive.assign(static_cast<size_t>(k_ * s.cap), options_.eos_id);
            s.finished.assign(static_cast<size_t>(k_ * s.cap), options_.eos_id);
            s.finished_len.assign(static_cast<size_t>(k_), 0);
            s.parents.assign(static_cast<size_t>(k_), 0);
            s.finished_flag.assign(static_cast<size_t>(k_), 0);
            s.alive_scores.assign(static_cast<size_t>(k_), mask);
            s.alive_scores[0] = 0.0f;
            s.finished_scores.assign(static_cast<size_t>(k_), mask);
        }
    }

    int64_t size() const { return static_cast<int64_t>(sentences_.size()); }
    bool expanded() const { return expanded_; }
    int64_t rows_per_sentence() const { return expanded_ ? k_ : 1; }
    int64_t rows() const { return size() * rows_per_sentence(); }

    // The rules before renormalization, in place ([rows, V]: one row per sentence before the first step, K after).
    void before_renormalize(float* log_probs, const Columns& columns) {
        Rules rules(options_, columns);
        const int64_t per = rows_per_sentence();
        for (int64_t i = 0; i < size(); ++i) {
            const Sentence& s = sentences_[i];
            for (int64_t b = 0; b < per; ++b) {
                rules.before_renormalize(log_probs + (i * per + b) * columns.size, history(s, b), forced(s));
            }
        }
    }

    Step advance(float* log_probs, const Columns& columns, bool renormalized);

    void join(Beam& other) {
        if (!expanded_ || !other.expanded_) {
            throw std::invalid_argument("a search joins another once both have taken their first step");
        }
        if (other.penalty_.size() > penalty_.size()) {
            penalty_ = other.penalty_;
            normalizer_ = other.normalizer_;
        }
        for (Sentence& s : other.sentences_) sentences_.push_back(std::move(s));
        other.sentences_.clear();
    }

    // Drop the sentences ``ids``; the rows kept.
    std::vector<int64_t> remove(const int64_t* ids, int64_t count) {
        const std::unordered_set<int64_t> gone(ids, ids + count);
        std::vector<int64_t> keep;
        for (int64_t i = 0; i < size(); ++i) {
            if (!gone.count(sentences_[i].id)) keep.push_back(i);
        }
        compact(keep);
        return rows_of(keep, rows_per_sentence());
    }

   private:
    History history(const Sentence& s, int64_t beam) const {
        return {s.alive.data() + beam * s.cap, s.steps, s.prefix.data(), static_cast<int64_t>(s.prefix.size())};
    }
    bool forced(const Sentence& s) const { return options_.forced_eos && s.cap == s.steps + 1; }
    int64_t generated(const Sentence& s, int64_t length) const {
        return std::max<int64_t>(length - static_cast<int64_t>(s.prefix.size()), 1);
    }

    bool advance_sentence(Sentence& s, const float* const* rows, const Columns& columns);
    int64_t stable_length(const Sentence& s) const;
    void merge_finished(Sentence& s, const float* scores, const char* flags, int64_t length);
    Finished result(const Sentence& s) const;

    void compact(const std::vector<int64_t>& keep) {
        std::vector<Sentence> kept;
        kept.reserve(keep.size());
        for (int64_t i : keep) kept.push_back(std::move(sentences_[i]));
        sentences_ = std::move(kept);
    }

    Options options_;
    int64_t k_;
    std::vector<Sentence> sentences_;
    std::vector<float> penalty_, normalizer_;
    bool expanded_ = false;
    // Per-step scratch, reused.
    TopK top_;
    std::vector<float> scores_, alive_candidates_, finished_candidates_, merged_;
    std::vector<int64_t> beam_, token_, pick_, order_;
    std::vector<char> flags_;
    std::vector<int64_t> next_alive_, next_finished_, next_len_;
    std::vector<float> next_scores_;
    std::vector<char> next_flag_;
};

inline Step Beam::advance(float* log_probs, const Columns& columns, bool renormalized) {
    const int64_t n = size(), width = columns.size, per = rows_per_sentence();
    if (k_ * width < 2 * k_) throw std::invalid_argument("beam search needs at least 2 log-prob columns");
    const bool first = !expanded_;
    Rules rules(options_, columns);
    std::vector<const float*> rows(static_cast<size_t>(k_));
    std::vector<char> done(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        Sentence& s = sentences_[i];
        for (int64_t b = 0; b < per; ++b) {
            float* row = log_probs + (i * per + b) * width;
            if (!renormalized) rules.before_renormalize(row, history(s, b), forced(s));
            rules.after_renormalize(row, history(s, b));
        }
        // Before the first step every beam of a sentence has the same history: its one row serves the K beams.
        for (int64_t b = 0; b < k_; ++b) rows[b] = log_probs + (i * per + (first ? 0 : b)) * width;
        done[i] = advance_sentence(s, rows.data(), columns);
    }
    expanded_ = true;
    Step step;
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < n; ++i) {
        if (!done[i]) {
            keep.push_back(i);
            continue;
        }
        step.finished.push_back(result(sentences_[i]));
    }
    // Streaming (beam.py's _stream): the finished sentences' results, then the stable prefixes that grew.
    std::vector<std::pair<const int64_t*, int64_t>> streamed;
    if (options_.stream) {
        for (const Finished& f : step.finished) {
            step.stream_ids.push_back(f.id);
            streamed.emplace_back(f.tokens.data(), static_cast<int64_t>(f.tokens.size()));
        }
        for (int64_t i : keep) {
            Sentence& s = sentences_[i];
            const int64_t stable = stable_length(s);
            if (stable <= s.stable) continue;
            s.stable = stable;
            step.stream_ids.push_back(s.id);
            streamed.emplace_back(s.alive.data(), stable);
        }
        if (!streamed.empty()) {
            fill_stream(step, static_cast<int64_t>(streamed.size()), options_.eos_id,
                        [&streamed](int64_t i) { return streamed[i]; });
        }
    }
    if (keep.empty()) return step;
    step.has_plan = true;
    for (int64_t i : keep) {
        Sentence& s = sentences_[i];
        for (int64_t b = 0; b < k_; ++b) {
            step.tokens.push_back(s.alive[b * s.cap + s.steps]);
            step.rows.push_back(first ? i : i * k_ + s.parents[b]);
        }
        s.steps += 1;
    }
    if (first) {
        step.has_encoder_rows = true;
        step.encoder_rows = step.rows;
    } else if (keep.size() < static_cast<size_t>(n)) {
        step.has_encoder_rows = true;
        step.encoder_rows = rows_of(keep, k_);
    }
    if (keep.size() < static_cast<size_t>(n)) compact(keep);
    return step;
}

// One sentence's step (beam.py's _advance of either rule set); whether the sentence is done.
inline bool Beam::advance_sentence(Sentence& s, const float* const* rows, const Columns& columns) {
    const int64_t k = k_, k2 = 2 * k_, width = columns.size, length = s.steps + 1;
    const float penalty = penalty_.at(generated(s, length));
    top_.reset(k2);
    if (options_.gnmt) {
        top_k_beams<true>(rows, s.alive_scores.data(), k, width, penalty, top_);
    } else {
        top_k_beams<false>(rows, s.alive_scores.data(), k, width, 1.0f, top_);
    }
    scores_.resize(k2);
    beam_.resize(k2);
    token_.resize(k2);
    alive_candidates_.resize(k2);
    finished_candidates_.resize(k2);
    flags_.resize(k2);
    pick_.resize(k2);
    for (int64_t j = 0; j < k2; ++j) {
        scores_[j] = top_[j].score;
        beam_[j] = top_[j].index / width;
        token_[j] = columns.id(top_[j].index % width);
    }
    const bool at_cap = s.cap <= length;
    const bool all_finished = std::all_of(s.finished_flag.begin(), s.finished_flag.end(), [](char f) { return f; });
    std::vector<float> next_alive_scores(static_cast<size_t>(k));
    if (options_.gnmt) {
        for (int64_t j = 0; j < k2; ++j) {
            const bool eos = token_[j] == options_.eos_id;
            alive_candidates_[j] = eos ? scores_[j] + -kT2TInf : scores_[j];
            finished_candidates_[j] = eos ? scores_[j] : scores_[j] + -kT2TInf;
            flags_[j] = eos;
        }
        order_descending(alive_candidates_.data(), k2, pick_.data());
        for (int64_t b = 0; b < k; ++b) next_alive_scores[b] = scores_[pick_[b]] * penalty;  // T2T's log-probs
    } else {
        for (int64_t j = 0; j < k2; ++j) {
            const bool hit = token_[j] == options_.eos_id || at_cap;
            alive_candidates_[j] = hit ? scores_[j] + kHFMask : scores_[j];
            float candidate = scores_[j] / penalty;
            if (options_.early_stopping && all_finished) candidate = candidate + kHFMask;
            if (!s.improvable) candidate = candidate + kHFMask;
            flags_[j] = hit && j < k;  // only candidates among the first K of the 2K finish
            if (!flags_[j]) candidate = candidate + kHFMask;
            finished_candidates_[j] = candidate;
        }
        order_descending(alive_candidates_.data(), k2, pick_.data());
        for (int64_t b = 0; b < k; ++b) next_alive_scores[b] = alive_candidates_[pick_[b]];
    }
    // Finished hypotheses first: they read the alive sequences this step extends.
    merge_finished(s, finished_candidates_.data(), flags_.data(), length);
    next_alive_.resize(static_cast<size_t>(k * s.cap));
    for (int64_t b = 0; b < k; ++b) {
        const int64_t j = pick_[b];
        std::copy_n(s.alive.begin() + beam_[j] * s.cap, s.steps, next_alive_.begin() + b * s.cap);
        next_alive_[b * s.cap + s.steps] = token_[j];
        s.parents[b] = beam_[j];
    }
    std::swap(s.alive, next_alive_);
    s.alive_scores = next_alive_scores;
    if (options_.gnmt) {
        const float bound = s.alive_scores[0] / penalty_.at(generated(s, s.cap));
        float best = s.finished_scores[0];
        for (float score : s.finished_scores) best = score > best || std::isnan(score) ? score : best;
        return best > bound || at_cap;
    }
    // Can the best alive beam still beat the worst finished one? (transformers' early_stopping=False heuristic)
    const float best_alive = s.alive_scores[0] / penalty;
    float worst = s.finished_scores[0];
    for (float score : s.finished_scores) worst = score < worst || std::isnan(score) ? score : worst;
    bool improvable = false;
    for (int64_t b = 0; b < k; ++b) improvable = improvable || best_alive > (s.finished_flag[b] ? worst : kHFMask);
    s.improvable = s.improvable && improvable;
    bool done = !s.improvable || at_cap;
    if (options_.early_stopping) {
        done = done || std::all_of(s.finished_flag.begin(), s.finished_flag.end(), [](char f) { return f; });
    }
    return done;
}

// The length of the prefix a sentence's alive beams (steps + 1 tokens, just extended) and its finished hypotheses
// share: whatever comes, its result starts with it (beam.py's _stream).
inline int64_t Beam::stable_length(const Sentence& s) const {
    const int64_t* best = s.alive.data();
    int64_t shared = s.steps + 1;
    for (int64_t b = 1; b < k_; ++b) {
        const int64_t* other = s.alive.data() + b * s.cap;
        int64_t j = 0;
        while (j < shared && other[j] == best[j]) ++j;
        shared = j;
    }
    for (int64_t slot = 0; slot < k_; ++slot) {
        if (!s.finished_flag[slot]) continue;
        const int64_t* other = s.finished.data() + slot * s.cap;
        const int64_t limit = std::min(shared, s.finished_len[slot]);
        int64_t j = 0;
        while (j < limit && other[j] == best[j]) ++j;
        shared = j;
    }
    return shared;
}

// Keep the K best of the finished hypotheses and the 2K candidates (beam.py's _merge_finished).
inline void Beam::merge_finished(Sentence& s, const float* scores, const char* flags, int64_t length) {
    const int64_t k = k_, cap = s.cap;
    merged_.assign(s.finished_scores.begin(), s.finished_scores.end());
    merged_.insert(merged_.end(), scores, scores + 2 * k);
    order_.resize(static_cast<size_t>(3 * k));
    order_descending(merged_.data(), 3 * k, order_.data());
    next_finished_.resize(static_cast<size_t>(k * cap));
    next_len_.resize(static_cast<size_t>(k));
    next_scores_.resize(static_cast<size_t>(k));
    next_flag_.resize(static_cast<size_t>(k));
    for (int64_t slot = 0; slot < k; ++slot) {
        const int64_t from = order_[slot];
        next_scores_[slot] = merged_[from];
        int64_t* target = next_finished_.data() + slot * cap;
        if (from < k) {
            std::copy_n(s.finished.begin() + from * cap, s.finished_len[from], target);
            next_len_[slot] = s.finished_len[from];
            next_flag_[slot] = s.finished_flag[from];
        } else {
            const int64_t j = from - k;
            std::copy_n(s.alive.begin() + beam_[j] * cap, s.steps, target);
            target[s.steps] = token_[j];
            next_len_[slot] = length;
            next_flag_[slot] = flags[j];
        }
    }
    std::swap(s.finished, next_finished_);
    std::swap(s.finished_len, next_len_);
    std::swap(s.finished_scores, next_scores_);
    std::swap(s.finished_flag, next_flag_);
}

// A done sentence's hypothesis and its alternatives (beam.py's _final and _alternatives).
inline Finished Beam::result(const Sentence& s) const {
    const int64_t k = k_, cap = s.cap, length = s.steps + 1;
    auto finished_tokens = [&s, cap](int64_t slot) {
        return std::vector<int64_t>(s.finished.begin() + slot * cap, s.finished.begin() + slot * cap + s.finished_len[slot]);
    };
    auto alive_tokens = [&s, cap, length](int64_t slot) {
        return std::vector<int64_t>(s.alive.begin() + slot * cap, s.alive.begin() + slot * cap + length);
    };
    const bool use_finished = options_.gnmt
        ? std::any_of(s.finished_flag.begin(), s.finished_flag.end(), [](char f) { return f; })
        : static_cast<bool>(s.finished_flag[0]);
    Finished out{s.id, use_finished ? finished_tokens(0) : alive_tokens(0),
                 static_cast<double>(use_finished ? s.finished_scores[0] : s.alive_scores[0]), {}};
    const int64_t wanted = options_.num_hypotheses - 1;
    if (wanted <= 0) return out;
    std::vector<std::vector<int64_t>> seen{out.tokens};
    auto unseen = [&seen](const std::vector<int64_t>& tokens) {
        return std::find(seen.begin(), seen.end(), tokens) == seen.end();
    };
    for (int64_t slot = 0; slot < k; ++slot) {
        if (!s.finished_flag[slot]) continue;
        std::vector<int64_t> tokens = finished_tokens(slot);
        if (!unseen(tokens)) continue;
        seen.push_back(tokens);
        out.alternatives.emplace_back(std::move(tokens), static_cast<double>(s.finished_scores[slot]));
    }
    const float normalizer = normalizer_.at(generated(s, length));
    for (int64_t slot = 0; slot < k; ++slot) {
        if (static_cast<int64_t>(out.alternatives.size()) >= wanted) break;
        std::vector<int64_t> tokens = alive_tokens(slot);
        if (!unseen(tokens) || !(static_cast<double>(s.alive_scores[slot]) > -1.0e8)) continue;
        seen.push_back(tokens);
        out.alternatives.emplace_back(std::move(tokens), static_cast<double>(s.alive_scores[slot] / normalizer));
    }
    if (static_cast<int64_t>(out.alternatives.size()) > wanted) out.alternatives.resize(static_cast<size_t>(wanted));
    return out;
}

}  // namespace mtgate
