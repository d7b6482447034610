/* JSON answers in the server tests: a value by a dotted path ("choices.0.text": object keys and
 * array indices), failing the test when a string or number is not there. */
#ifndef VKI_TESTS_VT_JSON_H
#define VKI_TESTS_VT_JSON_H

#include <cjson/cJSON.h>

const cJSON *vt_json_get(const cJSON *o, const char *path); /* NULL when absent */
const char *vt_json_str(const cJSON *o, const char *path);
double vt_json_num(const cJSON *o, const char *path);

#endif
