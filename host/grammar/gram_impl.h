/* The grammar module's shared private types: the lowered grammar and the vocabulary trie. */
#ifndef VKI_HOST_GRAM_IMPL_H
#define VKI_HOST_GRAM_IMPL_H

#include "host/grammar/grammar.h"

#define GRAM_MAX_CP 0x10FFFFu

/* Element kinds. Every alternative is a run of elements closed by GE_END. */
enum { GE_END = 0, GE_CHAR = 1, GE_RULE = 2 };

typedef struct gram_elem {
    uint32_t kind;            /* GE_* */
    uint32_t arg;             /* GE_CHAR: class id; GE_RULE: rule id; GE_END: the rule it closes */
} gram_elem;

typedef struct gram_range {
    uint32_t lo, hi;          /* code points, inclusive */
} gram_range;

struct gram_grammar {
    gram_elem *elems;         /* [n_elems] alternatives, each closed by GE_END */
    uint32_t n_elems;
    uint32_t *alts;           /* [n_alts] first element of each alternative */
    uint32_t n_alts;
    uint32_t *rule_alt;       /* [n_rules + 1] rule r's alternatives: alts[rule_alt[r] ..
                                 rule_alt[r + 1]) */
    char **names;             /* [n_rules] */
    uint32_t n_rules, root;
    gram_range *ranges;       /* [cls[n_classes]] sorted, disjoint, not adjacent */
    uint32_t *cls;            /* [n_classes + 1] class c: ranges[cls[c] .. cls[c + 1]) */
    uint32_t n_classes;
};

/* Whether class c of g contains code point cp / some code point in [lo, hi]. O(log ranges).
 * Ranges are merged, so a class covers an interval only if one range does. */
bool gram_class_has(const gram_grammar *g, uint32_t c, uint32_t cp);
bool gram_class_meets(const gram_grammar *g, uint32_t c, uint32_t lo, uint32_t hi);
bool gram_class_covers(const gram_grammar *g, uint32_t c, uint32_t lo, uint32_t hi); /* all of [lo, hi] */

/* The vocabulary trie, nodes in depth-first preorder (a node's subtree is the nodes up to
 * next[i]), so a walk is one forward pass that jumps over rejected subtrees. */
struct gram_vocab {
    uint32_t n_vocab;
    uint32_t n_nodes;
    uint8_t *byte;            /* [n_nodes] the edge byte into the node */
    uint16_t *depth;          /* [n_nodes] 1 for the root's children */
    uint32_t *next;           /* [n_nodes] index after the node's subtree */
    uint32_t *tok0;           /* [n_nodes] first of the node's tokens in tok_ids */
    uint32_t *n_tok;          /* [n_nodes] tokens whose bytes end here */
    int32_t *tok_ids;         /* [n_in_trie] token ids in trie order */
    uint32_t max_depth;       /* longest token in the trie */
    uint8_t *bytes;           /* the pieces */
    uint32_t *piece_off;      /* [n_vocab + 1] token id's bytes: bytes[piece_off[id] .. piece_off[id + 1]) */
    uint8_t *is_end;          /* [n_vocab] 1 for end-of-generation tokens */
};

#define GRAM_MAX_TOKEN_BYTES 1024u /* longer pieces are left out of the trie (never allowed) */

#endif
