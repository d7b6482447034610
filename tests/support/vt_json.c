#include "support/vt_json.h"

#include "support/vt.h"

const cJSON *vt_json_get(const cJSON *o, const char *path)
{
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(key)) : cJSON_GetObjectItemCaseSensitive(o, key);
        path += n + (path[n] == '.');
    }
    return o;
}

const char *vt_json_str(const cJSON *o, const char *path)
{
    const cJSON *v = vt_json_get(o, path);
    if (!cJSON_IsString(v))
        fail_msg("%s is not a string", path);
    return v->valuestring;
}

double vt_json_num(const cJSON *o, const char *path)
{
    const cJSON *v = vt_json_get(o, path);
    if (!cJSON_IsNumber(v))
        fail_msg("%s is not a number", path);
    return v->valuedouble;
}
