/* Hash slots (rslot.h): the key vectors are CLUSTER KEYSLOT's answers from a Redis 7 cluster. */
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

/* The slot of a command given as strings. */
static int slot_of(int argc, const char *const *argv)
{
    size_t len[16];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    return rslot_of_command(argc, argv, len);
}
#define SLOT_OF(...)                                                                               \
    slot_of(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *),                          \
            (const char *const[]){__VA_ARGS__})

static void test_command_slots(void)
{
    int foo = rslot_of_key("foo", 3);
    CHECK_EQ_INT(SLOT_OF("GET", "foo"), foo);
    CHECK_EQ_INT(SLOT_OF("hgetall", "foo"), foo); /* names are case-blind */
    CHECK_EQ_INT(SLOT_OF("SET", "foo", "bar", "PX", "10"), foo);
    CHECK_EQ_INT(SLOT_OF("PING"), RSLOT_NONE);
    CHECK_EQ_INT(SLOT_OF("INFO", "server"), RSLOT_NONE);
    CHECK_EQ_INT(SLOT_OF("SCRIPT", "LOAD", "return 1"), RSLOT_NONE);
    CHECK_EQ_INT(SLOT_OF("CLIENT", "TRACKING", "on"), RSLOT_NONE);
    CHECK_EQ_INT(SLOT_OF("DEL", "{foo}a", "{foo}b", "foo"), foo);
    CHECK_EQ_INT(SLOT_OF("DEL", "foo", "bar"), RSLOT_CROSS);
    CHECK_EQ_INT(SLOT_OF("EXISTS", "foo", "{bar}x"), RSLOT_CROSS);
    CHECK_EQ_INT(SLOT_OF("MSET", "{foo}1", "bar", "{foo}2", "bar"), foo); /* values not keys */
    CHECK_EQ_INT(SLOT_OF("MSET", "{foo}1", "v", "bar", "v"), RSLOT_CROSS);
    CHECK_EQ_INT(SLOT_OF("RENAME", "{foo}old", "{foo}new"), foo);
    CHECK_EQ_INT(SLOT_OF("RENAME", "foo", "bar"), RSLOT_CROSS);
    CHECK_EQ_INT(SLOT_OF("BLPOP", "{foo}q", "bar"), foo); /* bar is the timeout */
    CHECK_EQ_INT(SLOT_OF("BLPOP", "foo", "bar", "5"), RSLOT_CROSS);
    /* scripts: the keys only, never the arguments */
    CHECK_EQ_INT(SLOT_OF("EVALSHA", "abc", "2", "{foo}1", "{foo}2", "bar"), foo);
    CHECK_EQ_INT(SLOT_OF("EVALSHA", "abc", "2", "{foo}1", "bar"), RSLOT_CROSS);
    CHECK_EQ_INT(SLOT_OF("EVAL", "return 1", "0", "bar"), RSLOT_NONE);
    CHECK_EQ_INT(SLOT_OF("EVAL", "return 1", "3", "foo"), RSLOT_CROSS); /* more keys than args */
    CHECK_EQ_INT(SLOT_OF("EVAL", "return 1", "x", "foo"), RSLOT_CROSS);
    CHECK_EQ_INT(SLOT_OF("EVAL", "return 1"), RSLOT_CROSS);
}

/* The claim's keys (keys.h) share the template's slot; a wallet key has the user's. */
static void test_keys_share_their_tag_slot(void)
{
    char a[KEYS_LEN], b[KEYS_LEN], c[KEYS_LEN], d[KEYS_LEN];
    keys_template(a, 1810714735922956666);
    keys_template_user(b, 1810714735922956666, 42);
    keys_template_req(c, 1810714735922956666, 42, "r-1");
    keys_template_resv(d, 1810714735922956666);
    const char *argv[] = {"EVALSHA", "sha", "4", a, b, c, d, "now", "shop", "42:r-1"};
    size_t len[10];
    for (int i = 0; i < 10; i++)
        len[i] = strlen(argv[i]);
    CHECK_EQ_INT(rslot_of_command(10, argv, len), 10314);
    keys_wallet(a, 42);
    CHECK_EQ_INT(rslot_of_key(a, strlen(a)), rslot_of_key("42", 2));
}

static void test_parse_request(void)
{
    static const char cmd[] = "*3\r\n$3\r\nSET\r\n$3\r\nfoo\r\n$0\r\n\r\n";
    const char *argv[4];
    size_t len[4];
    CHECK_EQ_INT(rslot_parse_request(cmd, sizeof(cmd) - 1, argv, len, 4), 3);
    CHECK(len[0] == 3 && memcmp(argv[0], "SET", 3) == 0);
    CHECK(len[1] == 3 && memcmp(argv[1], "foo", 3) == 0);
    CHECK(len[2] == 0);
    CHECK_EQ_INT(rslot_parse_request(cmd, sizeof(cmd) - 1, argv, len, 2), -1); /* too many */
    CHECK_EQ_INT(rslot_parse_request(cmd, sizeof(cmd) - 2, argv, len, 4), -1); /* cut short */
    CHECK_EQ_INT(rslot_parse_request("*1\r\n$4\r\nPING\r\n", 14, argv, len, 4), 1);
    CHECK_EQ_INT(rslot_parse_request("*1\r\n$5\r\nPING\r\n", 14, argv, len, 4), -1);
    CHECK_EQ_INT(rslot_parse_request("PING\r\n", 6, argv, len, 4), -1);
    CHECK_EQ_INT(rslot_parse_request("*1\r\n$4\r\nPINGxx", 14, argv, len, 4), -1);
}

int main(void)
{
    RUN(test_key_slots_are_cluster_keyslot);
    RUN(test_command_slots);
    RUN(test_keys_share_their_tag_slot);
    RUN(test_parse_request);
    TEST_MAIN_END();
}
