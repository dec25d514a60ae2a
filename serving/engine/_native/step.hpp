// What one search step hands back to Python (serving/decoding/native.py): the next step's plan and the sentences it
// finished, as flat arrays the binding turns into numpy arrays and lists only once the work is done.
#pragma once

#include <cstdint>
#include <vector>

namespace mtgate {

struct Finished {
    int64_t id;
    std::vector<int64_t> tokens;
    double score;
    std::vector<std::pair<std::vector<int64_t>, double>> alternatives;
};

struct Step {
    bool has_plan = false;
    std::vector<int64_t> tokens;        // [m] the next step's inputs
    std::vector<int64_t> rows;          // [m] the row of this step each next row continues
    bool has_encoder_rows = false;
    std::vector<int64_t> encoder_rows;  // [m]
    std::vector<Finished> finished;
    // The streaming hook's arguments (Options::stream): sentence ids, their tokens [n, width] padded with EOS, and
    // their lengths. Greedy search: every sentence of the step; beam search: the sentences it finished (their
    // results), then those whose stable prefix grew (that prefix).
    bool has_stream = false;
    std::vector<int64_t> stream_ids, stream_tokens, stream_lengths;
    int64_t stream_width = 0;
};

// The rows of sentences ``keep`` (indices, ascending), each ``per`` rows wide.
inline std::vector<int64_t> rows_of(const std::vector<int64_t>& keep, int64_t per) {
    std::vector<int64_t> rows;
    rows.reserve(keep.size() * static_cast<size_t>(per));
    for (int64_t i : keep) {
        for (int64_t b = 0; b < per; ++b) rows.push_back(i * per + b);
    }
    return rows;
}

// Fill the streaming arrays with token sequences (each padded with ``eos`` to the longest).
template <typename Get>
void fill_stream(Step& step, int64_t count, int64_t eos, Get get) {
    step.has_stream = true;
    int64_t width = 0;
    for (int64_t i = 0; i < count; ++i) width = std::max<int64_t>(width, static_cast<int64_t>(get(i).second));
    step.stream_width = width;
    step.stream_tokens.assign(static_cast<size_t>(count * width), eos);
    for (int64_t i = 0; i < count; ++i) {
        const auto [tokens, length] = get(i);
        std::copy(tokens, tokens + length, step.stream_tokens.begin() + i * width);
        step.stream_lengths.push_back(length);
    }
}

}  // namespace mtgate
