/* namelist.h: the one comma-list walk. */
#include <string.h>

#include "namelist.h"
#include "testhelp.h"

/* The entries of list walked in mode, joined with '|' into out. Returns their count. */
static size_t walk(const char *list, namelist_mode mode, char *out, size_t cap)
{
    namelist it = namelist_of(list);
    const char *name;
    size_t len, n = 0, used = 0;
    out[0] = '\0';
    while (namelist_next(&it, mode, &name, &len)) {
        used += (size_t)snprintf(out + used, cap - used, "%s%.*s", n ? "|" : "", (int)len, name);
        n++;
    }
    return n;
}

static void test_entries(void)
{
    static const struct {
        const char *list;
        namelist_mode mode;
        size_t n;
        const char *joined;
    } cases[] = {
        {NULL, NAMELIST_EXACT, 0, ""},
        {"", NAMELIST_EXACT, 0, ""},
        {"", NAMELIST_TRIM, 0, ""},
        {"a", NAMELIST_EXACT, 1, "a"},
        {"a,bc,d", NAMELIST_EXACT, 3, "a|bc|d"},
        {",", NAMELIST_EXACT, 2, "|"},
        {"a,,b", NAMELIST_EXACT, 3, "a||b"},
        {"a,", NAMELIST_EXACT, 2, "a|"},
        {",a", NAMELIST_EXACT, 2, "|a"},
        {" a , b\t,\n c ", NAMELIST_EXACT, 3, " a | b\t|\n c "},
        {" a , b\t,\n c ", NAMELIST_TRIM, 3, "a|b|c"},
        {" a b ,  , ", NAMELIST_TRIM, 3, "a b||"},
        {"   ", NAMELIST_TRIM, 1, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[64];
        CHECK_EQ_INT(walk(cases[i].list, cases[i].mode, out, sizeof(out)), cases[i].n);
        CHECK_EQ_STR(out, cases[i].joined);
        CHECK_EQ_INT(namelist_count(cases[i].list), cases[i].n);
    }
}

static void test_has(void)
{
    CHECK(namelist_has("engine.expire,engine.remind", "engine.remind"));
    CHECK(namelist_has("engine.expire,engine.remind", "engine.expire"));
    CHECK(!namelist_has("engine.expire,engine.remind", "engine"));         /* whole entries */
    CHECK(!namelist_has("engine.expire,engine.remind", "engine.reminds")); /* not a prefix */
    CHECK(!namelist_has("a, b", "b"));                                     /* as written */
    CHECK(namelist_has("a,,b", "b"));
    CHECK(namelist_has("a,,b", "")); /* the empty entry is one */
    CHECK(!namelist_has("a,b", ""));
    CHECK(!namelist_has(NULL, "a"));
    CHECK(!namelist_has("", "a"));
}

int main(void)
{
    RUN(test_entries);
    RUN(test_has);
    TEST_MAIN_END();
}
