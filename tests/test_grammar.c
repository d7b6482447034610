/* The grammar engine (host/grammar/): GBNF accept/reject tables, parse errors naming the line and
 * column, JSON Schema conversion (instances that must and must not match, refused keywords), and
 * the token masks: at every step of random walks through each grammar, the mask built from the
 * per-position caches must equal the brute-force mask (every token's bytes pushed through the
 * automaton one by one), on a synthetic vocabulary full of multi-character and split-UTF-8
 * tokens and on the real vocabularies in ../shared/models/vocab. No GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "host/grammar/grammar.h"
#include "support/vt.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

/* A vocabulary given as an array of C strings (token i = words[i]; "" = never allowed). */
typedef struct word_vocab {
    const char *const *w;
    uint32_t n;
    int32_t end;              /* end-of-generation token, or -1 */
} word_vocab;

static vki_status word_piece(void *ctx, int32_t id, char *buf, size_t cap, size_t *n)
{
    const word_vocab *v = ctx;
    *n = strlen(v->w[id]);
    if (*n > cap)
        return VKI_ERR_INVALID_ARG;
    memcpy(buf, v->w[id], *n);
    return VKI_OK;
}

static bool word_end(void *ctx, int32_t id) { return id == ((const word_vocab *)ctx)->end; }

/* The 256 one-byte tokens: enough for gram_accepts, which walks bytes. */
static gram_vocab *byte_vocab(void)
{
    static char bytes[256][2];
    static const char *words[256];
    for (int i = 0; i < 256; i++) {
        bytes[i][0] = (char)(i ? i : 'x');
        words[i] = bytes[i];
    }
    word_vocab wv = {words, 256, -1};
    gram_vocab *v;
    assert_int_equal(gram_vocab_create(256, word_piece, word_end, &wv, &v), VKI_OK);
    return v;
}

static gram_automaton *compile(const char *gbnf, const gram_vocab *v)
{
    gram_grammar *g;
    char err[256] = "";
    if (gram_parse(gbnf, strlen(gbnf), &g, err, sizeof err) != VKI_OK)
        fail_msg("grammar refused: %s\n%s", err, gbnf);
    gram_automaton *a;
    assert_int_equal(gram_automaton_create(g, v, NULL, &a), VKI_OK);
    return a;
}

typedef struct accept_case {
    const char *grammar;
    const char *yes[8];
    const char *no[8];
} accept_case;

static void run_accept_cases(const accept_case *cases, size_t n, const gram_vocab *v)
{
    for (size_t i = 0; i < n; i++) {
        gram_automaton *a = compile(cases[i].grammar, v);
        for (int k = 0; k < 8 && cases[i].yes[k]; k++)
            if (!gram_accepts(a, cases[i].yes[k], strlen(cases[i].yes[k])))
                fail_msg("case %zu: %s\nshould accept \"%s\"", i, cases[i].grammar, cases[i].yes[k]);
        for (int k = 0; k < 8 && cases[i].no[k]; k++)
            if (gram_accepts(a, cases[i].no[k], strlen(cases[i].no[k])))
                fail_msg("case %zu: %s\nshould reject \"%s\"", i, cases[i].grammar, cases[i].no[k]);
        gram_automaton_free(a);
    }
}

/* ---- GBNF --------------------------------------------------------------------------------------- */

static const char JSON_GBNF[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const accept_case gbnf_cases[] = {
    {"root ::= \"a\" | \"b\"", {"a", "b"}, {"", "c", "ab", "ba"}},
    {"root ::= [a-z]+", {"a", "hello"}, {"", "Hello", "a b"}},
    {"root ::= [^a-z]*", {"", "ABC 123", "\xc3\xa9"}, {"a", "Az"}},
    {"root ::= \"x\"{2,4}", {"xx", "xxx", "xxxx"}, {"x", "xxxxx", ""}},
    {"root ::= \"x\"{3}", {"xxx"}, {"xx", "xxxx"}},
    {"root ::= \"x\"{2,}", {"xx", "xxxxxxxxxxxx"}, {"x"}},
    {"root ::= \"ab\"{0,2} \"c\"", {"c", "abc", "ababc"}, {"abababc", "ac", "bc"}},
    {"root ::= (\"ab\" | \"c\")* \"!\"", {"!", "ab!", "cabcc!"}, {"a!", "abab", "!!"}},
    {"root ::= \"ab\"? \"c\"", {"c", "abc"}, {"ac", "bc"}},
    {"root ::= \"\\n\\t\\\\\\\"\" [\\x41-\\x43] \"\\u00e9\" [\\U0001F600]",
     {"\n\t\\\"B\xc3\xa9\xf0\x9f\x98\x80"}, {"\n\t\\\"D\xc3\xa9\xf0\x9f\x98\x80", "\n\t\\\"B\xc3\xa9\xf0\x9f\x98\x81"}},
    {"root ::= . . .", {"abc", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}, {"ab", "abcd", "\xc3"}},
    {"root ::= [\xce\xb1-\xcf\x89]+", {"\xce\xb1\xce\xb2\xcf\x89"}, {"a", "\xce\x91"}},
    {"root ::= (\n  \"a\" # a comment\n  | \"b\"\n)\n# trailing comment\n", {"a", "b"}, {"ab"}},
    {"root ::= \"a\" |\n  \"b\"", {"a", "b"}, {"c"}},
    {"root ::= expr\nexpr ::= term ([-+*/] term)*\nterm ::= [0-9]+ | \"(\" expr \")\"",
     {"1", "1+2*3", "(1+2)*(3-4)/5"}, {"", "1+", "(1", "1)", "+1"}},
    {"root ::= \"a\" root | \"b\"", {"b", "ab", "aaaaaaaaaaaaaaaaaaaaaaaab"}, {"a", "aa", "ba"}},
    {"root ::= a b\na ::= \"x\" | \"\"\nb ::= \"y\" | \"\"", {"", "x", "y", "xy"}, {"yx", "xx"}},
    {"root ::= [\\]\\-\\[] [^\\]]", {"]a", "-x", "[b"}, {"a]", "]]"}},
    {JSON_GBNF, {"{}", "{\"a\": 1}", "{\"a\": [1, 2.5e3, true, null, \"x\\ny\"], \"b\": {}}"},
     {"", "{", "{\"a\" 1}", "{\"a\": 01x}", "[1]", "{\"a\": \"\\q\"}"}},
};

static void test_gbnf_accept(void **state)
{
    (void)state;
    gram_vocab *v = byte_vocab();
    run_accept_cases(gbnf_cases, sizeof gbnf_cases / sizeof *gbnf_cases, v);
    gram_vocab_free(v);
}

typedef struct error_case {
    const char *grammar;
    const char *want;          /* substring of the message */
} error_case;

static const error_case gbnf_errors[] = {
    {"root ::= foo", "line 1, column 10: undefined rule 'foo'"},
    {"rot ::= \"a\"", "no rule named 'root'"},
    {"", "no rule named 'root'"},
    {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
    {"root ::= \"abc", "line 1, column 10: unterminated string literal"},
    {"root ::= [a-", "line 1, column 10: unterminated character class"},
    {"root ::= \"a\\", "unexpected end of the grammar"},
    {"root ::= [ab", "line 1, column 10: unterminated character class"},
    {"root ::= (\"a\"", "line 1, column 10: unclosed '('"},
    {"root ::= *", "'*' has nothing before it to repeat"},
    {"root ::= \"a\"{3,2}", "maximum is below the minimum"},
    {"root ::= \"a\"{20000}", "repetition bound above 10000"},
    {"root ::= \"a\"{2", "expected '}'"},
    {"root ::= root \"a\"", "rule 'root' can reach itself without consuming a character"},
    {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "can reach itself without consuming a character"},
    {"root ::= (\"\" | \"a\")*", "can reach itself without consuming a character"},
    {"root ::= \"\\q\"", "line 1, column 11: unknown escape '\\q'"},
    {"root ::= \"\\xZZ\"", "needs 2 hex digits"},
    {"root ::= <think>", "token references"},
    {"root ::= [z-a]", "range ends below its start"},
    {"root ::= \"a\" )", "line 1, column 14: unexpected ')'"},
    {"root ::= \"\xff\"", "invalid UTF-8"},
    {"root \"a\"", "expected '::=' after the rule name 'root'"},
    {"::= \"a\"", "line 1, column 1: expected a rule name"},
    {"root ::= \"a\"\n  \"b\"", "line 2, column 3: expected a rule name"},
    {"root ::= @", "unexpected character '@'"},
};

static void test_gbnf_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof gbnf_errors / sizeof *gbnf_errors; i++) {
        gram_grammar *g = NULL;
        char err[256] = "";
        const char *t = gbnf_errors[i].grammar;
        assert_int_equal(gram_parse(t, strlen(t), &g, err, sizeof err), VKI_ERR_INVALID_ARG);
        assert_null(g);
        if (!strstr(err, gbnf_errors[i].want) || strncmp(err, "grammar: ", 9))
            fail_msg("case %zu: \"%s\"\nmessage \"%s\" lacks \"%s\"", i, t, err, gbnf_errors[i].want);
    }
}

/* ---- JSON Schema ----------------------------------------------------------------------------------- */

static gram_automaton *compile_schema(const char *schema, const gram_vocab *v)
{
    strbuf b = {0};
    char err[256] = "";
    if (gram_schema_to_gbnf(schema, strlen(schema), &b, err, sizeof err) != VKI_OK)
        fail_msg("schema refused: %s\n%s", err, schema);
    gram_automaton *a = compile(b.p, v);
    strbuf_free(&b);
    return a;
}

static const accept_case schema_cases[] = {
    {"{\"type\": \"string\"}", {"\"\"", "\"a b\"", "\"\\u00e9\\n\"", "\"\xc3\xa9\""}, {"a", "\"a", "1", "\"\\x\""}},
    {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", {"\"ab\"", "\"a\\nb\"", "\"\xc3\xa9\xc3\xa9\""},
     {"\"a\"", "\"abcd\""}},
    {"{\"type\": \"integer\"}", {"0", "-12", "1234567890123456"}, {"01", "1.5", "-", "12345678901234567", "1e3"}},
    {"{\"type\": \"number\"}", {"0", "-1.5", "2e10", "3.25E-7"}, {".5", "1.", "--1", "1e"}},
    {"{\"type\": \"boolean\"}", {"true", "false"}, {"True", "1"}},
    {"{\"type\": [\"integer\", \"null\"]}", {"3", "null"}, {"\"3\""}},
    {"{\"type\": \"string\", \"nullable\": true}", {"\"x\"", "null"}, {"1"}},
    {"{\"enum\": [\"red\", 2, null, {\"a\": [1]}]}", {"\"red\"", "2", "null", "{\"a\":[1]}"}, {"\"blue\"", "3", "\"2\""}},
    {"{\"const\": \"only\"}", {"\"only\""}, {"\"other\""}},
    {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}},"
     " \"required\": [\"name\", \"age\"]}",
     {"{\"name\": \"Al\", \"age\": 3}", "{\"name\":\"Al\",\"age\":3}", "{\n  \"name\": \"Al\",\n  \"age\": 3\n}"},
     {"{\"age\": 3, \"name\": \"Al\"}", "{\"name\": \"Al\"}", "{\"name\": \"Al\", \"age\": 3, \"x\": 1}", "{}"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"},"
     " \"c\": {\"type\": \"integer\"}}, \"required\": [\"b\"]}",
     {"{\"b\": 1}", "{\"a\": 1, \"b\": 2}", "{\"b\": 2, \"c\": 3}", "{\"a\": 1, \"b\": 2, \"c\": 3}"},
     {"{}", "{\"a\": 1}", "{\"a\": 1, \"c\": 3}", "{, \"b\": 1}", "{\"b\": 1,}"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}", {"{}", "{\"a\": 1}"},
     {"{\"b\": 1}", "{\"a\": \"x\"}"}},
    {"{\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"}}, \"required\": [\"id\"],"
     " \"additionalProperties\": {\"type\": \"string\"}}",
     {"{\"id\": 1}", "{\"id\": 1, \"x\": \"y\"}", "{\"id\": 1, \"i\": \"y\", \"idx\": \"z\", \"\": \"e\"}"},
     {"{\"id\": 1, \"x\": 2}", "{\"id\": 1, \"id\": \"y\"}", "{\"x\": \"y\"}"}},
    {"{\"type\": \"object\"}", {"{}", "{\"k\": [1, {\"z\": null}]}"}, {"[]", "{\"k\"}"}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 3}",
     {"[1]", "[1, 2, 3]", "[ 1 ,2 ]"}, {"[]", "[1, 2, 3, 4]", "[1,]", "[\"a\"]"}},
    {"{\"type\": \"array\", \"maxItems\": 0}", {"[]", "[ ]"}, {"[1]"}},
    {"{\"type\": \"array\"}", {"[]", "[1, \"a\", [null]]"}, {"[1", "{}"}},
    {"{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 1}]}", {"5", "\"a\""},
     {"\"ab\"", "true"}},
    {"{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, \"next\":"
     " {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\", \"next\"]}},"
     " \"$ref\": \"#/$defs/node\"}",
     {"{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": {\"v\": 3, \"next\": null}}}"},
     {"{\"v\": 1}", "{\"v\": 1, \"next\": {\"v\": 2}}"}},
    {"{\"title\": \"T\", \"description\": \"d\", \"x-extra\": 1, \"type\": \"boolean\"}", {"true"}, {"1"}},
    {"true", {"1", "\"s\"", "{\"a\": []}"}, {"", "x"}},
};

static void test_schema_accept(void **state)
{
    (void)state;
    gram_vocab *v = byte_vocab();
    for (size_t i = 0; i < sizeof schema_cases / sizeof *schema_cases; i++) {
        gram_automaton *a = compile_schema(schema_cases[i].grammar, v);
        for (int k = 0; k < 8 && schema_cases[i].yes[k]; k++)
            if (!gram_accepts(a, schema_cases[i].yes[k], strlen(schema_cases[i].yes[k])))
                fail_msg("schema %zu: %s\nshould accept %s", i, schema_cases[i].grammar, schema_cases[i].yes[k]);
        for (int k = 0; k < 8 && schema_cases[i].no[k]; k++)
            if (gram_accepts(a, schema_cases[i].no[k], strlen(schema_cases[i].no[k])))
                fail_msg("schema %zu: %s\nshould reject %s", i, schema_cases[i].grammar, schema_cases[i].no[k]);
        gram_automaton_free(a);
    }
    gram_vocab_free(v);
}

/* ---- pattern and format --------------------------------------------------------------------------- */

/* s (n bytes) as our grammars write it in JSON, with the quotes: \" \\ \b \t \n \f \r, \u00XX for
 * the other controls and DEL, the rest as it is. For a schema's text too. */
static void json_quote(const char *s, size_t n, char *out)
{
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == 8 ? "\\b" : c == 9 ? "\\t" : c == 10 ? "\\n"
                          : c == 12 ? "\\f" : c == 13 ? "\\r" : NULL;
        if (esc)
            o += (size_t)sprintf(out + o, "%s", esc);
        else if (c < 0x20 || c == 0x7F)
            o += (size_t)sprintf(out + o, "\\u%04x", c);
        else
            out[o++] = (char)c;
    }
    out[o++] = '"';
    out[o] = 0;
}

static gram_automaton *compile_pattern(const char *re, const gram_vocab *v)
{
    char q[512], schema[640];
    json_quote(re, strlen(re), q);
    snprintf(schema, sizeof schema, "{\"type\": \"string\", \"pattern\": %s}", q);
    return compile_schema(schema, v);
}

/* PCRE2 with JavaScript's \u and \x (ALT_BSUX), [] and [^] (ALLOW_EMPTY_CLASS), `$` only at the
 * very end and `.` stopping at CR and LF (ANYCRLF; JavaScript's U+2028 / U+2029 are in no test
 * string): the reference. */
static pcre2_code *pcre_compile(const char *re)
{
    int code;
    PCRE2_SIZE off;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
    uint32_t opts = PCRE2_UTF | PCRE2_ALT_BSUX | PCRE2_DOLLAR_ENDONLY | PCRE2_ALLOW_EMPTY_CLASS;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, opts, &code, &off, cc);
    pcre2_compile_context_free(cc);
    if (!c)
        fail_msg("PCRE2 refuses %s at %zu", re, (size_t)off);
    return c;
}

static bool pcre_matches(pcre2_code *c, const char *s, size_t n)
{
    pcre2_match_data *m = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, n, 0, 0, m, NULL);
    pcre2_match_data_free(m);
    return rc >= 0;
}

static bool grammar_takes(gram_automaton *a, const char *s, size_t n)
{
    char t[256];
    json_quote(s, n, t);
    return gram_accepts(a, t, strlen(t));
}

typedef struct pattern_case {
    const char *re;
    const char *yes[6];
    const char *no[6];
} pattern_case;

static const pattern_case pattern_cases[] = {
    {"^[a-c]+$", {"a", "abc", "cab"}, {"", "abd", "A"}},
    {"ab", {"ab", "xaby", "aab"}, {"a", "ba", ""}},
    {"^ab+", {"ab", "abbb", "abc"}, {"a", "xab"}},
    {"^\\d{3}-\\d{4}$", {"555-1234"}, {"5551234", "55-1234", "555-12345"}},
    {"^[^\"\\\\]*$", {"plain", ""}, {"a\"b", "a\\b"}},
    {"^a.c$", {"abc", "a c", "a\"c", "a\\c", "a\tc", "a\xc3\xa9" "c"}, {"a\nc", "ac", "a\rc"}},
    {"^(?:ab|cd)+(?<tail>x{1,2})?$", {"ab", "abcdxx", "cdx"}, {"abx3", "", "abxxx"}},
    {"^\\w+@\\w+\\.com$", {"me@host.com", "a_1@b.com"}, {"me@host.org", "@host.com", "me@hostXcom"}},
    {"^\\s*$", {"", "  ", "\t\n"}, {" a"}},
    {"^[\\u00e9\\u4e2d-\\u4e2f]$", {"\xc3\xa9", "\xe4\xb8\xad"}, {"e", "\xe4\xb8\xb0"}},
    {"^x{2$", {"x{2"}, {"xx"}},
    {"^caf\\u00e9|^\\x41$", {"caf\xc3\xa9", "caf\xc3\xa9s", "A"}, {"AA", "xcaf\xc3\xa9"}},
    {"^[\\b]\\cJ\\0$", {"\b\n"}, {"b\n", "\b"}},
    {"^[\\D][\\W]$", {"a-"}, {"1-", "a_"}},
    {"^a+?b{2,}?$", {"abb", "aabbb"}, {"ab", "b"}},
    {"^[^]$", {"\n", "a"}, {"", "ab"}},
    {"^(a?){2,3}(?:)b$", {"b", "ab", "aab", "aaab"}, {"aaaab", "a"}},
    /* PCRE2 refuses these: a surrogate pair written as two \u escapes */
    {"^\\uD83D\\uDE00$", {"\xf0\x9f\x98\x80"}, {"\xf0\x9f\x98\x81"}},
};
#define N_PCRE_CASES (sizeof pattern_cases / sizeof *pattern_cases - 1)

/* Patterns as string schemas: the instances of a table (each also checked against PCRE2), then
 * for 18 patterns every one of 2,000 seeded random strings over an alphabet of their characters
 * (quotes, backslashes, controls, a two-byte letter): the grammar takes a string's JSON text
 * exactly when PCRE2 finds the pattern in it. Formats: RFC 3339 dates with real calendar days,
 * times, date-times, UUIDs. */
static void test_schema_pattern(void **state)
{
    (void)state;
    gram_vocab *v = byte_vocab();
    for (size_t i = 0; i < sizeof pattern_cases / sizeof *pattern_cases; i++) {
        const pattern_case *pc = &pattern_cases[i];
        gram_automaton *a = compile_pattern(pc->re, v);
        pcre2_code *re = i < N_PCRE_CASES ? pcre_compile(pc->re) : NULL;
        for (int k = 0; k < 6; k++)
            for (int yes = 0; yes < 2; yes++) {
                const char *t = yes ? pc->yes[k] : pc->no[k];
                if (!t)
                    continue;
                size_t n = strlen(t) + (!strcmp(pc->re, "^[\\b]\\cJ\\0$") && yes); /* its NUL */
                if (re && pcre_matches(re, t, n) != (bool)yes)
                    fail_msg("pattern %s: PCRE2 disagrees with the table on case %d of %s", pc->re, k, yes ? "yes" : "no");
                if (grammar_takes(a, t, n) != (bool)yes)
                    fail_msg("pattern %s should %s case %d", pc->re, yes ? "accept its yes" : "reject its no", k);
            }
        pcre2_code_free(re);
        gram_automaton_free(a);
    }
    static const char *const random_res[] = {
        "^[a-c]+$", "ab", "^a*b?c{2,3}$", "^(ab|b)*$", "^[^a]{1,3}$", "^\\d{1,2}-\\d$", "^\\w+\\s?$", "a|^b",
        "^.{2}$", "^[\\\\\"]+$", "x{2", "^(?:a|b)+c$", "^[-a\\n]$", "\\.\\.", "^(a|\\u00e9)+$", "ab+", "^a{2}",
        "c?d*"};
    static const char *const alphabet[] = {"a", "b", "c", "0", "1", "-", "_", ".", " ", "\"", "\\", "\n", "\t", "x", "{",
                                           "2", "\xc3\xa9"};
    vt_rng rng = vt_rng_seeded("schema pattern");
    uint32_t agree = 0, matched = 0;
    for (size_t i = 0; i < sizeof random_res / sizeof *random_res; i++) {
        gram_automaton *a = compile_pattern(random_res[i], v);
        pcre2_code *re = pcre_compile(random_res[i]);
        for (int k = 0; k < 2000; k++) {
            char t[64];
            size_t n = 0, len = vt_range(&rng, 0, 7);
            for (size_t j = 0; j < len; j++) {
                const char *c = alphabet[vt_range(&rng, 0, sizeof alphabet / sizeof *alphabet - 1)];
                memcpy(t + n, c, strlen(c));
                n += strlen(c);
            }
            bool want = pcre_matches(re, t, n);
            if (grammar_takes(a, t, n) != want) {
                char shown[256];
                json_quote(t, n, shown);
                fail_msg("pattern %s on %s: PCRE2 says %s, the grammar the opposite", random_res[i], shown,
                         want ? "match" : "no match");
            }
            agree++;
            matched += want;
        }
        pcre2_code_free(re);
        gram_automaton_free(a);
    }
    print_message("patterns: %u random strings, grammar = PCRE2 on all (%u matches)\n", agree, matched);
    static const struct {
        const char *format, *yes[6], *no[6];
    } fmts[] = {
        {"date", {"2024-02-28", "2023-12-31", "2024-04-30", "0001-01-01"},
         {"2023-02-30", "2023-04-31", "2023-13-01", "2023-1-01", "2024-02-29", "2023-00-10"}},
        {"time", {"12:34:56Z", "23:59:59.123+05:30", "00:00:00-00:00"}, {"24:00:00Z", "12:60:00Z", "12:34:56", "1:02:03Z"}},
        {"date-time", {"2024-01-01T00:00:00Z", "1999-12-31T23:59:59.5+01:00"}, {"2024-01-01 00:00:00Z", "2024-01-01T25:00:00Z"}},
        {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
         {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
    };
    for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\": \"string\", \"format\": \"%s\"}", fmts[i].format);
        gram_automaton *a = compile_schema(schema, v);
        for (int k = 0; k < 6; k++) {
            if (fmts[i].yes[k] && !grammar_takes(a, fmts[i].yes[k], strlen(fmts[i].yes[k])))
                fail_msg("format %s should accept %s", fmts[i].format, fmts[i].yes[k]);
            if (fmts[i].no[k] && grammar_takes(a, fmts[i].no[k], strlen(fmts[i].no[k])))
                fail_msg("format %s should reject %s", fmts[i].format, fmts[i].no[k]);
        }
        gram_automaton_free(a);
    }
    gram_vocab_free(v);
}

/* Integer bounds: for fixed and seeded random ranges (1 to 16 digits, both signs, exclusive and
 * fractional bounds), the grammar accepts exactly the integers inside, probed at and around both
 * bounds, at random inside and outside, and never a leading zero, "-0" or "+". */
static bool probe(gram_automaton *a, long long v)
{
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    return gram_accepts(a, t, strlen(t));
}

static void check_range(const gram_vocab *v, const char *schema, long long lo, long long hi, vt_rng *rng)
{
    gram_automaton *a = compile_schema(schema, v);
    long long probes[80];
    int n = 0;
    for (int d = -3; d <= 3; d++) {
        probes[n++] = lo + d;
        probes[n++] = hi + d;
    }
    long long span = hi - lo;
    for (int k = 0; k < 20; k++) /* inside */
        probes[n++] = lo + (span > 0 ? (long long)(vt_u64(rng) % (unsigned long long)(span + 1)) : 0);
    for (int k = 0; k < 20; k++) { /* anywhere within 16 digits, and one digit more */
        long long m = (long long)(vt_u64(rng) % 10000000000000000ULL);
        probes[n++] = k == 19 ? 10000000000000000LL : vt_u64(rng) & 1 ? -m : m;
    }
    for (int i = 0; i < n; i++) {
        bool in = probes[i] >= lo && probes[i] <= hi && probes[i] < 10000000000000000LL &&
                  probes[i] > -10000000000000000LL;
        if (probe(a, probes[i]) != in)
            fail_msg("%s: %lld %s", schema, probes[i], in ? "refused" : "accepted");
    }
    static const char *const never[] = {"-0", "00", "01", "+1", "-", "", "1.0", "-01"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        if (gram_accepts(a, never[i], strlen(never[i])))
            fail_msg("%s: accepted \"%s\"", schema, never[i]);
    gram_automaton_free(a);
}

static void test_schema_integer_ranges(void **state)
{
    (void)state;
    gram_vocab *v = byte_vocab();
    vt_rng rng = vt_rng_seeded("grammar integer ranges");
    char schema[256];
    static const struct { const char *kw; long long lo, hi; } fixed[] = {
        {"\"minimum\": 0, \"maximum\": 0", 0, 0},
        {"\"minimum\": -5, \"maximum\": -5", -5, -5},
        {"\"minimum\": -10, \"maximum\": 10", -10, 10},
        {"\"minimum\": 7, \"maximum\": 123", 7, 123},
        {"\"minimum\": -1000, \"maximum\": -37", -1000, -37},
        {"\"minimum\": 1", 1, 9999999999999999LL},
        {"\"maximum\": -1", -9999999999999999LL, -1},
        {"\"exclusiveMinimum\": 0, \"exclusiveMaximum\": 100", 1, 99},
        {"\"minimum\": 0.5, \"maximum\": 9.5", 1, 9},
        {"\"exclusiveMinimum\": -0.5, \"maximum\": 1e300", 0, 9999999999999999LL},
        {"\"minimum\": 1, \"exclusiveMinimum\": 3, \"maximum\": 10, \"exclusiveMaximum\": 9", 4, 8},
        {"\"minimum\": 100, \"maximum\": 199", 100, 199},
        {"\"minimum\": 1099, \"maximum\": 9100", 1099, 9100},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
        snprintf(schema, sizeof schema, "{\"type\": \"integer\", %s}", fixed[i].kw);
        check_range(v, schema, fixed[i].lo, fixed[i].hi, &rng);
    }
    for (int i = 0; i < 150; i++) {
        long long m = 1;
        for (uint32_t d = vt_range(&rng, 0, 15); d; d--)
            m *= 10;
        long long lo = (long long)(vt_u64(&rng) % (unsigned long long)m) * (vt_u64(&rng) & 1 ? -1 : 1);
        long long hi = lo + (long long)(vt_u64(&rng) % (unsigned long long)m);
        if (hi > 9999999999999999LL)
            hi = 9999999999999999LL;
        snprintf(schema, sizeof schema, "{\"type\": \"integer\", \"minimum\": %lld, \"maximum\": %lld}", lo, hi);
        check_range(v, schema, lo, hi, &rng);
    }
    gram_vocab_free(v);
}

/* Number bounds: the grammar accepts exactly the decimals (no exponent, at most 16 integer and 16
 * fraction digits, no "-0") inside the bounds, judged by an exact decimal comparison of the texts.
 * Probes: the bounds' own values, their neighbours 1 and 2 units away at every digit position
 * from 10^1 down to 10^-16, each written with its shortest fraction and with trailing zeros,
 * random values inside, random values anywhere. */

/* A plain decimal text "-?D+(.D+)?" as sign, integer digits without leading zeros, fraction
 * digits without trailing zeros. */
typedef struct { bool neg; char ip[40], fp[40]; } dtext;

static void dparse(const char *t, dtext *d)
{
    memset(d, 0, sizeof *d);
    d->neg = *t == '-';
    t += d->neg;
    while (*t == '0' && t[1] && t[1] != '.')
        t++;
    size_t n = strcspn(t, ".");
    memcpy(d->ip, t, n);
    if (t[n] == '.')
        snprintf(d->fp, sizeof d->fp, "%s", t + n + 1);
    for (size_t k = strlen(d->fp); k && d->fp[k - 1] == '0'; k--)
        d->fp[k - 1] = 0;
    if (!strcmp(d->ip, "0") && !d->fp[0])
        d->neg = false; /* -0 == 0 */
}

static int dcmp_abs(const dtext *a, const dtext *b)
{
    size_t la = strlen(a->ip), lb = strlen(b->ip);
    if (la != lb)
        return la < lb ? -1 : 1;
    int c = strcmp(a->ip, b->ip);
    if (c)
        return c < 0 ? -1 : 1;
    c = strcmp(a->fp, b->fp); /* no trailing zeros: plain string order is numeric order */
    return c < 0 ? -1 : c > 0;
}

static int dcmp(const char *x, const char *y)
{
    dtext a, b;
    dparse(x, &a);
    dparse(y, &b);
    if (a.neg != b.neg)
        return a.neg ? -1 : 1;
    int c = dcmp_abs(&a, &b);
    return a.neg ? -c : c;
}

/* A probe value: sign and a magnitude of ip + fp * 1e-16 (0 <= fp < 1e16). */
typedef struct { bool neg; unsigned long long ip, fp; } pval;

static pval pval_of(const char *t)
{
    dtext d;
    dparse(t, &d);
    pval v = {d.neg, 0, 0};
    if (strlen(d.ip) > 16)
        v.ip = 10000000000000000ULL; /* out of the texts' range */
    else
        v.ip = strtoull(d.ip, NULL, 10);
    char f[17] = "0000000000000000";
    memcpy(f, d.fp, strlen(d.fp) > 16 ? 16 : strlen(d.fp));
    v.fp = strtoull(f, NULL, 10);
    return v;
}

/* v + k * 10^(-j) as a signed sum (k may be negative). */
static pval pval_add(pval v, long long k, int j)
{
    unsigned long long unit = 1;
    for (int i = 0; i < 16 - j; i++)
        unit *= 10; /* in fp units; j <= 16; j < 0 for 10 and 100 */
    if (j < 0)
        unit = 10000000000000000ULL * (j == -1 ? 10 : 100);
    /* to a signed pair of (ip, fp) magnitudes, add, and back */
    __int128 m = (__int128)v.ip * 10000000000000000LL + v.fp;
    if (v.neg)
        m = -m;
    m += (__int128)k * unit;
    pval r = {m < 0, 0, 0};
    if (m < 0)
        m = -m;
    r.ip = (unsigned long long)(m / 10000000000000000LL);
    r.fp = (unsigned long long)(m % 10000000000000000LL);
    return r;
}

/* v as text: the shortest fraction, or padded with zeros to `pad` digits (when longer). */
static void pval_text(pval v, int pad, char *t, size_t cap)
{
    char f[17];
    snprintf(f, sizeof f, "%016llu", v.fp);
    int n = 16;
    while (n > 0 && f[n - 1] == '0')
        n--;
    if (pad > n)
        n = pad;
    int w = snprintf(t, cap, "%s%llu", v.neg && (v.ip || v.fp) ? "-" : "", v.ip);
    if (n)
        snprintf(t + w, cap - (size_t)w, ".%.*s", n, f);
}

typedef struct { const char *schema_kw, *lo, *hi; bool lo_ex, hi_ex; } num_case;

static bool check_number_range(const gram_vocab *v, const num_case *nc, vt_rng *rng)
{
    char schema[512];
    snprintf(schema, sizeof schema, "{\"type\": \"number\", %s}", nc->schema_kw);
    strbuf g = {0};
    char err[256] = "";
    if (gram_schema_to_gbnf(schema, strlen(schema), &g, err, sizeof err) != VKI_OK) {
        /* refused as empty: then no grid value next to lo (the least one inside would be) is inside */
        if (!strstr(err, "no number lies between") || !nc->lo)
            fail_msg("%s: %s", schema, err);
        for (long long k = -1; k <= 2; k++) {
            char t[64];
            pval_text(pval_add(pval_of(nc->lo), k, 16), 0, t, sizeof t);
            int cl = dcmp(t, nc->lo), ch = nc->hi ? dcmp(t, nc->hi) : -1;
            if ((nc->lo_ex ? cl > 0 : cl >= 0) && (nc->hi_ex ? ch < 0 : ch <= 0))
                fail_msg("%s refused as empty, but %s lies inside", schema, t);
        }
        strbuf_free(&g);
        return false;
    }
    gram_automaton *a = compile(g.p, v);
    strbuf_free(&g);
    pval probes[300];
    int n = 0;
    const char *bounds[2] = {nc->lo, nc->hi};
    for (int b = 0; b < 2; b++) {
        if (!bounds[b])
            continue;
        pval x = pval_of(bounds[b]);
        probes[n++] = x;
        for (int j = -2; j <= 16; j++)
            for (long long k = -2; k <= 2; k++)
                if (k)
                    probes[n++] = pval_add(x, k, j);
    }
    pval lo = nc->lo ? pval_of(nc->lo) : (pval){true, 9999999999999999ULL, 0};
    pval hi = nc->hi ? pval_of(nc->hi) : (pval){false, 9999999999999999ULL, 0};
    for (int k = 0; k < 20; k++) { /* inside (near lo, by a random amount at a random scale) and anywhere */
        pval in = pval_add(lo, (long long)vt_range(rng, 0, 99), (int)vt_range(rng, 0, 16));
        probes[n++] = in;
        probes[n++] = (pval){vt_u64(rng) & 1, vt_u64(rng) % (k < 10 ? 100 : 10000000000000000ULL),
                             vt_u64(rng) % 10000000000000000ULL};
    }
    (void)hi;
    for (int i = 0; i < n; i++) {
        if (probes[i].ip >= 10000000000000000ULL)
            continue; /* beyond 16 integer digits: never a text */
        for (int pad = 0; pad <= 16; pad += 16) {
            char t[64];
            pval_text(probes[i], pad, t, sizeof t);
            int cl = nc->lo ? dcmp(t, nc->lo) : 1, ch = nc->hi ? dcmp(t, nc->hi) : -1;
            bool in = (nc->lo_ex ? cl > 0 : cl >= 0) && (nc->hi_ex ? ch < 0 : ch <= 0);
            if (gram_accepts(a, t, strlen(t)) != in)
                fail_msg("%s: %s %s", schema, t, in ? "refused" : "accepted");
        }
    }
    static const char *const never[] = {"-0", "-0.0", "00", "01", "+1", "-", "", ".5", "1.", "1e1", "0.5e0",
                                        "1.00000000000000000"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        if (gram_accepts(a, never[i], strlen(never[i])))
            fail_msg("%s: accepted \"%s\"", schema, never[i]);
    gram_automaton_free(a);
    return true;
}

/* A random decimal of 1 to 15 significant digits with its point anywhere from 10^15 to 10^-18. */
static void random_decimal(vt_rng *rng, bool allow_neg, char *t, size_t cap)
{
    int sig = (int)vt_range(rng, 1, 15), point = (int)vt_range(rng, 0, 33) - 18; /* 10^point: first digit */
    char digits[16];
    for (int i = 0; i < sig; i++)
        digits[i] = (char)('0' + (i ? vt_range(rng, 0, 9) : vt_range(rng, 1, 9)));
    size_t w = 0;
    if (allow_neg && vt_u64(rng) & 1)
        t[w++] = '-';
    if (point < 0) {
        w += (size_t)snprintf(t + w, cap - w, "0.");
        for (int i = -1; i > point; i--)
            t[w++] = '0';
        for (int i = 0; i < sig; i++)
            t[w++] = digits[i];
    } else {
        for (int i = 0; i <= point || i < sig; i++) {
            if (i == point + 1)
                t[w++] = '.';
            t[w++] = i < sig ? digits[i] : '0';
        }
    }
    t[w] = 0;
}

static void test_schema_number_ranges(void **state)
{
    (void)state;
    gram_vocab *v = byte_vocab();
    vt_rng rng = vt_rng_seeded("grammar number ranges");
    static const num_case fixed[] = {
        {"\"minimum\": 0, \"maximum\": 1", "0", "1", false, false},
        {"\"minimum\": 0.1, \"maximum\": 0.3", "0.1", "0.3", false, false},
        {"\"exclusiveMinimum\": 0, \"exclusiveMaximum\": 1", "0", "1", true, true},
        {"\"minimum\": -1.5, \"maximum\": 2.25", "-1.5", "2.25", false, false},
        {"\"minimum\": -10, \"exclusiveMaximum\": -9.99", "-10", "-9.99", false, true},
        {"\"exclusiveMinimum\": -0.001", "-0.001", NULL, true, false},
        {"\"maximum\": 2.5e-3", NULL, "0.0025", false, false},
        {"\"minimum\": 1.5e-17, \"maximum\": 1e-15", "0.000000000000000015", "0.000000000000001", false, false},
        {"\"minimum\": -1e-20, \"exclusiveMaximum\": 1e-20", "-0.00000000000000000001", "0.00000000000000000001",
         false, true},
        {"\"minimum\": 0.5, \"maximum\": 0.5", "0.5", "0.5", false, false},
        {"\"minimum\": 123456789012345.6, \"maximum\": 1e300", "123456789012345.6", NULL, false, false},
        {"\"minimum\": 1, \"exclusiveMinimum\": 1, \"maximum\": 3, \"exclusiveMaximum\": 2.5", "1", "2.5", true, true},
        {"\"minimum\": 0.9999999999999999, \"maximum\": 1.0000000000000002", "0.9999999999999999",
         "1.0000000000000002", false, false},
        {"\"maximum\": 1e400, \"minimum\": -1e999", NULL, NULL, false, false}, /* +-inf: the whole range */
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        assert_true(check_number_range(v, &fixed[i], &rng));
    int empty = 0;
    for (int i = 0; i < 120; i++) {
        char lo[64], hi[64], kw[200];
        random_decimal(&rng, true, lo, sizeof lo);
        random_decimal(&rng, true, hi, sizeof hi);
        if (dcmp(lo, hi) > 0) {
            char t[64];
            memcpy(t, lo, sizeof t), memcpy(lo, hi, sizeof lo), memcpy(hi, t, sizeof hi);
        }
        num_case nc = {kw, lo, hi, vt_u64(&rng) & 1, vt_u64(&rng) & 1};
        if (!dcmp(lo, hi))
            nc.lo_ex = nc.hi_ex = false;
        snprintf(kw, sizeof kw, "\"%s\": %s, \"%s\": %s", nc.lo_ex ? "exclusiveMinimum" : "minimum", lo,
                 nc.hi_ex ? "exclusiveMaximum" : "maximum", hi);
        empty += !check_number_range(v, &nc, &rng);
    }
    fprintf(stderr, "number ranges: %zu fixed, 120 random (%d with no 16-digit decimal inside)\n",
            sizeof fixed / sizeof *fixed, empty);
    assert_true(empty < 30);
    gram_vocab_free(v);
}

static const error_case schema_errors[] = {
    {"{\"type\": \"string\", \"pattern\": \"^a(?=b)\"}", "json_schema: (root): pattern \"^a(?=b)\": at offset 3: (?= groups"},
    {"{\"type\": \"string\", \"pattern\": \"(a)\\\\1\"}", "at offset 5: backreferences are not supported"},
    {"{\"type\": \"string\", \"pattern\": \"\\\\bword\"}", "word boundaries (\\b) are not supported"},
    {"{\"type\": \"string\", \"pattern\": \"a^b\"}", "'^' is supported only at the start"},
    {"{\"type\": \"string\", \"pattern\": \"a$b\"}", "'$' is supported only at the start"},
    {"{\"type\": \"string\", \"pattern\": \"[]\"}", "a character class that matches nothing"},
    {"{\"type\": \"string\", \"pattern\": \"a**\"}", "a quantifier after a quantifier"},
    {"{\"type\": \"string\", \"pattern\": \"^(a|)+$\"}", "at offset 1: an unbounded repetition of a group that can match the empty"},
    {"{\"type\": \"string\", \"pattern\": \"(b(a?)*)\"}", "at offset 2: an unbounded repetition"},
    {"{\"type\": \"string\", \"pattern\": \"*a\"}", "nothing to repeat"},
    {"{\"type\": \"string\", \"pattern\": \"(ab\"}", "an unclosed group"},
    {"{\"type\": \"string\", \"pattern\": \"ab)\"}", "an unmatched ')'"},
    {"{\"type\": \"string\", \"pattern\": \"[b-a]\"}", "a range out of order"},
    {"{\"type\": \"string\", \"pattern\": \"a{3,2}\"}", "{3,2} out of order"},
    {"{\"type\": \"string\", \"pattern\": \"a{20000}\"}", "a repetition bound above"},
    {"{\"type\": \"string\", \"pattern\": \"\\\\p{L}\"}", "Unicode property escapes"},
    {"{\"type\": \"string\", \"pattern\": \"[a\"}", "an unterminated character class"},
    {"{\"type\": \"string\", \"pattern\": \"a\", \"maxLength\": 3}", "'pattern' together with minLength or maxLength"},
    {"{\"type\": \"string\", \"pattern\": 3}", "'pattern' must be a string"},
    {"{\"type\": \"string\", \"format\": \"email\"}", "keyword 'format': \"email\" is not supported (date, time"},
    {"{\"type\": \"string\", \"format\": \"date\", \"pattern\": \"a\"}", "'pattern' together with 'format'"},
    {"{\"properties\": {\"a\": {\"type\": \"number\", \"minimum\": 1e17}}}",
     "json_schema: /properties/a: no number lies between the minimum and the maximum"},
    {"{\"type\": \"number\", \"minimum\": 0.5, \"exclusiveMaximum\": 0.5}", "no number lies between"},
    {"{\"type\": \"number\", \"minimum\": 1e400}", "no number lies between"},
    {"{\"type\": \"number\", \"exclusiveMaximum\": \"1\"}", "'exclusiveMaximum' must be a number"},
    {"{\"maximum\": 3}", "keyword 'maximum' needs \"type\": \"number\" or \"integer\""},
    {"{\"type\": \"integer\", \"minimum\": 5, \"exclusiveMaximum\": 5}", "no integer lies between the minimum and"},
    {"{\"type\": \"integer\", \"exclusiveMinimum\": true}", "'exclusiveMinimum' must be a number"},
    {"{\"type\": \"array\", \"items\": {\"format\": \"uri\"}}", "/items: keyword 'format': \"uri\" is not supported"},
    {"{\"allOf\": [{}]}", "keyword 'allOf' is not supported"},
    {"{\"type\": \"strin\"}", "unknown type \"strin\""},
    {"{\"type\": 3}", "'type' must be a string"},
    {"{\"$ref\": \"#/$defs/missing\"}", "$ref \"#/$defs/missing\" does not name a schema"},
    {"{\"$ref\": \"http://x/y.json\"}", "only references inside this schema"},
    {"{\"type\": \"string\", \"minLength\": -1}", "'minLength' must be a non-negative integer"},
    {"{\"type\": \"string\", \"minLength\": 5, \"maxLength\": 2}", "maxLength 2 is below minLength 5"},
    {"{\"type\": \"array\", \"maxItems\": 1e9}", "'maxItems' 1000000000 is above the supported"},
    {"{\"enum\": []}", "'enum' must be a non-empty array"},
    {"{\"required\": \"a\"}", "'required' must be an array of strings"},
    {"false", "the schema false admits no value"},
    {"{\"type\": \"object\", \"properties\": {\"a\": false}}", "/properties/a: the schema false admits no value"},
    {"{\"type\": ", "json_schema: not valid JSON: at byte 9"},
    {"{\"a\": 1, \"a\": 2}", "duplicate key \"a\""},
    {"{\"enum\": [\"\xff\"]}", "json_schema: (root): a name or value is not valid UTF-8"},
    /* found by fuzz_grammar (it leaked): a non-ASCII name next to additionalProperties */
    {"{\"properties\": {\"\u00e9\": {}}, \"additionalProperties\": true}", "non-ASCII characters cannot be told apart"},
};

static void test_schema_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof schema_errors / sizeof *schema_errors; i++) {
        strbuf b = {0};
        char err[256] = "";
        const char *s = schema_errors[i].grammar;
        assert_int_equal(gram_schema_to_gbnf(s, strlen(s), &b, err, sizeof err), VKI_ERR_INVALID_ARG);
        if (!strstr(err, schema_errors[i].want))
            fail_msg("case %zu: %s\nmessage \"%s\" lacks \"%s\"", i, s, err, schema_errors[i].want);
        strbuf_free(&b);
    }
}

/* ---- token masks: cached decomposition == brute force ------------------------------------------------ */

/* Brute force: token i allowed iff its bytes push through the automaton from q. */
static void brute_mask(gram_automaton *a, const gram_vocab *v, gram_state q, uint32_t *m)
{
    uint32_t n = gram_vocab_size(v);
    memset(m, 0, (n + 31) / 32 * 4);
    for (uint32_t id = 0; id < n; id++) {
        uint32_t len;
        const uint8_t *p = gram_vocab_piece(v, (int32_t)id, &len);
        gram_state r;
        if (len && gram_advance_bytes(a, q, p, len, &r, NULL, 0) == VKI_OK)
            m[id >> 5] |= 1u << (id & 31);
    }
}

/* Random walks of up to `steps` tokens; the mask is compared with brute force at every step.
 * Returns the tokens generated in total. */
static uint32_t walk_compare(const char *label, gram_automaton *a, const gram_vocab *v, vt_rng *rng, uint32_t walks,
                             uint32_t steps)
{
    uint32_t n = gram_vocab_size(v), words = (n + 31) / 32, total = 0;
    uint32_t *want = malloc(words * 4), *ids = malloc(n * 4);
    char err[256];
    for (uint32_t w = 0; w < walks; w++) {
        gram_state q;
        assert_int_equal(gram_start(a, &q, err, sizeof err), VKI_OK);
        for (uint32_t s = 0; s < steps; s++) {
            const uint32_t *got;
            uint32_t n_allowed;
            if (gram_mask(a, q, &got, &n_allowed, err, sizeof err) != VKI_OK)
                fail_msg("%s: mask: %s", label, err);
            brute_mask(a, v, q, want);
            uint32_t k = 0;
            for (uint32_t id = 0; id < n; id++) {
                bool g = got[id >> 5] >> (id & 31) & 1, b = want[id >> 5] >> (id & 31) & 1;
                if (g != b) {
                    uint32_t len;
                    const uint8_t *p = gram_vocab_piece(v, (int32_t)id, &len);
                    fail_msg("%s: walk %u step %u: token %u \"%.*s\" %s by the mask, %s by brute force", label, w, s,
                             id, (int)len, p, g ? "allowed" : "refused", b ? "allowed" : "refused");
                }
                if (g)
                    ids[k++] = id;
            }
            assert_int_equal(k, n_allowed);
            if (!k || (gram_can_end(a, q) && vt_range(rng, 0, 9) == 0))
                break;
            int32_t t = (int32_t)ids[vt_range(rng, 0, k - 1)];
            assert_int_equal(gram_advance(a, q, t, &q, err, sizeof err), VKI_OK);
            total++;
        }
    }
    free(want);
    free(ids);
    return total;
}

/* A synthetic vocabulary: every single byte that matters to JSON, plus random multi-byte tokens
 * drawn from a pool of JSON punctuation, letters, digits, spaces and UTF-8 characters that are
 * cut at random byte positions (so tokens start and end inside characters). */
static char **synth_words(vt_rng *rng, uint32_t n)
{
    static const char *const pool[] = {"{", "}", "[", "]", ":", ",", "\"", "\\", " ", "\n", "a", "b", "z", "N", "0",
                                       "1", "9", "-", ".", "e", "true", "false", "null", "name", "\xc3\xa9",
                                       "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\\n", "\\u00", "\t", "x", "+"};
    char **w = malloc(n * sizeof *w);
    for (uint32_t i = 0; i < n; i++) {
        char buf[64] = "";
        size_t len = 0;
        if (i < 128) { /* all ASCII bytes */
            buf[0] = (char)(i ? i : 'q');
            len = 1;
        } else {
            for (uint32_t k = 0, parts = vt_range(rng, 1, 4); k < parts; k++) {
                const char *p = pool[vt_range(rng, 0, sizeof pool / sizeof *pool - 1)];
                size_t pl = strlen(p);
                memcpy(buf + len, p, pl);
                len += pl;
            }
            size_t a = vt_range(rng, 0, 2) == 0 ? vt_range(rng, 0, (uint32_t)len - 1) : 0; /* cut at bytes */
            size_t b = vt_range(rng, 0, 2) == 0 ? vt_range(rng, (uint32_t)a + 1, (uint32_t)len) : len;
            memmove(buf, buf + a, b - a);
            len = b - a;
        }
        w[i] = malloc(len + 1);
        memcpy(w[i], buf, len);
        w[i][len] = 0;
    }
    return w;
}

static const char NESTED_SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 12},"
    "\"age\": {\"type\": \"integer\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 3},"
    "\"address\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
    "  \"zip\": {\"type\": [\"string\", \"null\"]}}, \"required\": [\"city\"]},"
    "\"kind\": {\"enum\": [\"a\", \"b\"]}},"
    "\"required\": [\"name\", \"address\"], \"additionalProperties\": {\"type\": \"number\"}}";

static void test_masks_synthetic(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("grammar masks");
    const uint32_t n = 3000;
    char **w = synth_words(&rng, n);
    word_vocab wv = {(const char *const *)w, n, 7}; /* token 7 plays end-of-generation */
    gram_vocab *v;
    assert_int_equal(gram_vocab_create(n, word_piece, word_end, &wv, &v), VKI_OK);
    assert_true(gram_vocab_is_end(v, 7));
    const char *grammars[] = {
        JSON_GBNF,
        "root ::= [\xc3\xa9\xe2\x82\xac a-z]{0,6} \"!\"",
        "root ::= (\"ab\" | [0-9]+ | \"\\\"\" [^\"]* \"\\\"\")+",
    };
    for (size_t i = 0; i < sizeof grammars / sizeof *grammars; i++) {
        gram_automaton *a = compile(grammars[i], v);
        char label[32];
        snprintf(label, sizeof label, "grammar %zu", i);
        uint32_t t = walk_compare(label, a, v, &rng, 12, 40);
        gram_stats st;
        gram_automaton_stats(a, &st);
        print_message("%-12s %4u tokens checked, %u states, %u positions walked\n", label, t, st.states, st.positions);
        gram_automaton_free(a);
    }
    gram_automaton *a = compile_schema(NESTED_SCHEMA, v);
    uint32_t t = walk_compare("nested schema", a, v, &rng, 12, 60);
    print_message("%-12s %4u tokens checked\n", "schema", t);
    gram_automaton_free(a);
    gram_vocab_free(v);
    for (uint32_t i = 0; i < n; i++)
        free(w[i]);
    free(w);
}

/* The same on real vocabularies: byte-level BPE (GPT-2, 50,257 tokens) and SentencePiece with
 * byte fallback (LLaMA, 32,000 tokens: byte tokens are single bytes of split characters). */
static void test_masks_real_vocab(void **state)
{
    (void)state;
    const char *files[] = {"vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-llama-spm.gguf"};
    vt_rng rng = vt_rng_seeded("grammar masks (real vocabularies)");
    for (size_t f = 0; f < 2; f++) {
        char path[512];
        if (!vt_shared_model(files[f], path, sizeof path)) {
            print_message("SKIP: ../shared/models/%s not found\n", files[f]);
            continue;
        }
        vki_tokenizer *tok;
        char err[256];
        assert_int_equal(vki_tokenizer_load(path, &tok, err, sizeof err), VKI_OK);
        gram_vocab *v;
        assert_int_equal(gram_vocab_from_tokenizer(tok, &v), VKI_OK);
        gram_automaton *a = compile_schema(NESTED_SCHEMA, v);
        uint32_t t = walk_compare(files[f], a, v, &rng, 3, 40);
        print_message("%-34s %u tokens checked, %u trie nodes\n", files[f], t, gram_vocab_nodes(v));
        gram_automaton_free(a);
        gram_vocab_free(v);
        vki_tokenizer_free(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_accept),
        cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_schema_accept),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_schema_pattern),
        cmocka_unit_test(test_schema_integer_ranges),
        cmocka_unit_test(test_schema_number_ranges),
        cmocka_unit_test(test_masks_synthetic),
        cmocka_unit_test(test_masks_real_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
