/* Hash slots of keys (rslot.h): the vectors are CLUSTER KEYSLOT's answers from a Redis 7 cluster.
 */
#include <string.h>

#include "keys.h"
#include "rslot.h"
#include "testhelp.h"

static void test_key_slots_are_cluster_keyslot(void)
{
    static const struct {
        const char *key;
        int slot;
    } v[] = {
        {"foo", 12182},
        {"bar", 5061},
        {"{foo}bar", 12182},
        {"foo{}{bar}", 8363},
        {"foo{{bar}}zap", 4015},
        {"foo{bar}{zap}", 5061},
        {"123456789", 12739},
        {"", 0},
        {"quan:tpl:{1810714735922956666}", 10314},
        {"{1810714735922956666}", 10314},
        {"quan:gen", 9691},
        {"{", 4092},
        {"}", 12090},
        {"{}", 15257},
        {"a{b", 13340},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        CHECK_EQ_INT(rslot_of_key(v[i].key, strlen(v[i].key)), v[i].slot);
}

/* A wallet key has the user's slot (the claim call's keys, all in the template's: test_rcmd.c). */
static void test_keys_share_their_tag_slot(void)
{
    char a[KEYS_LEN];
    keys_wallet(a, 42);
    CHECK_EQ_INT(rslot_of_key(a, strlen(a)), rslot_of_key("42", 2));
}

int main(void)
{
    RUN(test_key_slots_are_cluster_keyslot);
    RUN(test_keys_share_their_tag_slot);
    TEST_MAIN_END();
}
