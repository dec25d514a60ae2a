// The slot bookkeeping of a stationary cache (serving/rows/slots.py's SlotRows._assign, _copy and _pair_by_owner):
// which slot each next row takes, and the copies of a row's filled cache (and encoder outputs) into a free slot.
// The arrays are SlotRows' numpy arrays, written in place.
#pragma once

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace mtgate {

struct SlotArrays {
    int64_t* owner;       // [R] the encoder row each slot holds (-1: none)
    int64_t* positions;   // [R] cache positions each slot's row has filled
    int64_t* source_len;  // [R] source positions each slot's encoder row needs
    float* cache;         // [L, 2, R, H, M, Dh]
    float* cross;         // [L, 2, R, H, S, Dh]
    float* src_bias;      // [R, 1, 1, S]
    int64_t layers2;      // L * 2
    int64_t slots, heads, capacity, head_dim, source_width;
};

// Slot ``target`` continues the row in slot ``source``: its filled cache, its encoder row unless the slot holds
// that one already, and its position.
inline void copy_slot(SlotArrays& a, int64_t source, int64_t target) {
    const int64_t filled = a.positions[source];
    const int64_t run = filled * a.head_dim;  // floats of one head's filled positions
    const int64_t head = a.capacity * a.head_dim;
    for (int64_t lk = 0; lk < a.layers2; ++lk) {
        for (int64_t h = 0; h < a.heads; ++h) {
            float* base = a.cache + (lk * a.slots * a.heads + h) * head;
            std::memcpy(base + target * a.heads * head, base + source * a.heads * head, sizeof(float) * run);
        }
    }
    if (a.owner[target] != a.owner[source]) {
        const int64_t block = a.heads * a.source_width * a.head_dim;  // one slot's encoder outputs in one layer/kind
        for (int64_t lk = 0; lk < a.layers2; ++lk) {
            float* base = a.cross + lk * a.slots * block;
            std::memcpy(base + target * block, base + source * block, sizeof(float) * block);
        }
        std::memcpy(a.src_bias + target * a.source_width, a.src_bias + source * a.source_width,
                    sizeof(float) * a.source_width);
        a.owner[target] = a.owner[source];
        a.source_len[target] = a.source_len[source];
    }
    a.positions[target] = filled;
}

// A hole for each moving row (``wanted[i]``: the encoder row it needs, -1: a new row), from ``holes`` (holding the
// encoder rows ``holders``): one holding the same encoder row where there is one (the last such hole), else the
// holes left, grouped by holder in order of first appearance.
inline std::vector<int64_t> pair_by_owner(const std::vector<int64_t>& wanted, const std::vector<int64_t>& holes,
                                          const std::vector<int64_t>& holders) {
    std::unordered_map<int64_t, size_t> group_of;
    std::vector<std::vector<int64_t>> groups;
    for (size_t i = 0; i < holes.size(); ++i) {
        auto [it, added] = group_of.emplace(holders[i], groups.size());
        if (added) groups.emplace_back();
        groups[it->second].push_back(holes[i]);
    }
    std::vector<int64_t> chosen(wanted.size(), -1);
    std::vector<size_t> unmatched;
    for (size_t i = 0; i < wanted.size(); ++i) {
        auto it = wanted[i] >= 0 ? group_of.find(wanted[i]) : group_of.end();
        if (it != group_of.end() && !groups[it->second].empty()) {
            chosen[i] = groups[it->second].back();
            groups[it->second].pop_back();
        } else {
            unmatched.push_back(i);
        }
    }
    size_t next = 0;
    for (const std::vector<int64_t>& group : groups) {
        for (int64_t hole : group) {
            if (next == unmatched.size()) return chosen;
            chosen[unmatched[next++]] = hole;
        }
    }
    return chosen;
}

// The next rows' slots: row i continues the row in slot origin[i] (-1: a new row). The first row to name a slot
// keeps it; the others, and rows whose slot is at or above the new live count, take the free slots below it (a copy
// of what they continue), a slot of the same encoder row where there is one. Returns the slots; ``fresh`` gets the
// new rows' slots.
inline std::vector<int64_t> assign_slots(SlotArrays& a, const int64_t* origin, int64_t m, std::vector<int64_t>& fresh) {
    std::vector<int64_t> slot(static_cast<size_t>(m), -1);
    std::vector<char> first(static_cast<size_t>(m), 0), taken(static_cast<size_t>(m), 0);
    std::unordered_map<int64_t, int64_t> named;  // slot -> the first row naming it
    for (int64_t i = 0; i < m; ++i) {
        if (origin[i] >= 0 && named.emplace(origin[i], i).second) {
            first[i] = 1;
            slot[i] = origin[i];
            if (origin[i] < m) taken[origin[i]] = 1;
        }
    }
    std::vector<int64_t> holes, holders, moving, wanted;
    for (int64_t j = 0; j < m; ++j) {
        if (!taken[j]) {
            holes.push_back(j);
            holders.push_back(a.owner[j]);
        }
    }
    for (int64_t i = 0; i < m; ++i) {
        if (!first[i] || slot[i] >= m) {
            moving.push_back(i);
            wanted.push_back(origin[i] >= 0 ? a.owner[origin[i]] : -1);
        }
    }
    const std::vector<int64_t> chosen = pair_by_owner(wanted, holes, holders);
    for (size_t j = 0; j < moving.size(); ++j) slot[moving[j]] = chosen[j];
    for (int64_t i : moving) {
        if (origin[i] >= 0) copy_slot(a, origin[i], slot[i]);
    }
    for (int64_t i = 0; i < m; ++i) {
        if (origin[i] < 0) fresh.push_back(slot[i]);
    }
    return slot;
}

}  // namespace mtgate
