// Greedy search and sampling (serving/decoding/greedy.py): one row per sentence, the arg-max (or a draw) after the
// logits rules; a sentence's score is its summed log-prob after the rules, length-normalized.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "rules.hpp"
#include "step.hpp"

namespace mtgate {

class Greedy {
   public:
    struct Sentence {
        int64_t id, cap, steps = 0;
        std::vector<int64_t> prefix, out;
        double log_prob_sum = 0.0;
        uint64_t seed = 0;
    };

    // ``norm[l]``: the length-normalization divisor of l generated tokens (base.py's normalize_score, computed by
    // numpy in native.py).
    Greedy(Options options, std::vector<Sentence> sentences, std::vector<double> norm)
        : options_(std::move(options)), sentences_(std::move(sentences)), norm_(std::move(norm)) {}

    int64_t size() const { return static_cast<int64_t>(sentences_.size()); }
    int64_t rows() const { return size(); }

    // The rules before renormalization, in place ([n, V]).
    void before_renormalize(float* log_probs, const Columns& columns) {
        Rules rules(options_, columns);
        for (int64_t r = 0; r < size(); ++r) {
            Sentence& s = sentences_[r];
            rules.before_renormalize(log_probs + r * columns.size, history(s), forced(s));
        }
    }

    // One step over ``log_probs`` [n, V] (modified in place); ``renormalized``: before_renormalize and the
    // log-softmax were applied already.
    Step advance(float* log_probs, const Columns& columns, bool renormalized) {
        const int64_t n = size(), width = columns.size;
        Rules rules(options_, columns);
        Sampler sampler(options_);
        Step step;
        std::vector<int64_t> next(static_cast<size_t>(n));
        std::vector<char> done(static_cast<size_t>(n));
        bool any_done = false;
        for (int64_t r = 0; r < n; ++r) {
            Sentence& s = sentences_[r];
            float* row = log_probs + r * width;
            const History h = history(s);
            if (!renormalized) rules.before_renormalize(row, h, forced(s));
            rules.after_renormalize(row, h);
            const int64_t chosen = options_.sampling ? sampler.draw(row, width, s.seed, s.steps) : argmax(row, width);
            const bool generated = s.steps >= static_cast<int64_t>(s.prefix.size());
            if (generated) s.log_prob_sum += static_cast<double>(row[chosen]);
            const int64_t token = columns.id(chosen);
            s.out[s.steps] = token;
            s.steps += 1;
            next[r] = token;
            done[r] = (token == options_.eos_id && generated) || s.cap <= s.steps;
            any_done = any_done || done[r];
        }
        if (options_.stream) {
            for (const Sentence& s : sentences_) step.stream_ids.push_back(s.id);
            fill_stream(step, n, options_.eos_id, [this](int64_t i) {
                return std::pair<const int64_t*, int64_t>(sentences_[i].out.data(), sentences_[i].steps);
            });
        }
        std::vector<int64_t> keep;
        for (int64_t r = 0; r < n; ++r) {
            if (!done[r]) {
                keep.push_back(r);
                continue;
            }
            Sentence& s = sentences_[r];
            const int64_t length = std::max<int64_t>(s.steps - static_cast<int64_t>(s.prefix.size()), 1);
            step.finished.push_back(
                {s.id, std::vector<int64_t>(s.out.begin(), s.out.begin() + s.steps), s.log_prob_sum / norm_.at(length), {}});
        }
        if (keep.empty()) return step;
        step.has_plan = true;
        for (int64_t r : keep) step.tokens.push_back(next[r]);
        step.rows = keep;
        if (any_done) {
            step.has_encoder_rows = true;
            step.encoder_rows = keep;
            compact(keep);
        }
        return step;
    }

    void join(Greedy& other) {
        if (other.norm_.size() > norm_.size()) norm_ = other.norm_;
        for (Sentence& s : other.sentences_) sentences_.push_back(std::move(s));
        other.sentences_.clear();
    }

    // Drop the sentences ``ids``; the rows kept.
    std::vector<int64_t> remove(const int64_t* ids, int64_t count) {
        const std::unordered_set<int64_t> gone(ids, ids + count);
        std::vector<int64_t> keep;
        for (int64_t r = 0; r < size(); ++r) {
            if (!gone.count(sentences_[r].id)) keep.push_back(r);
        }
        compact(keep);
        return keep;
    }

   private:
    History history(const Sentence& s) const {
        return {s.out.data(), s.steps, s.prefix.data(), static_cast<int64_t>(s.prefix.size())};
    }
    bool forced(const Sentence& s) const { return options_.forced_eos && s.cap == s.steps + 1; }

    void compact(const std::vector<int64_t>& keep) {
        std::vector<Sentence> kept;
        kept.reserve(keep.size());
        for (int64_t r : keep) kept.push_back(std::move(sentences_[r]));
        sentences_ = std::move(kept);
    }

    Options options_;
    std::vector<Sentence> sentences_;
    std::vector<double> norm_;
};

}  // namespace mtgate
