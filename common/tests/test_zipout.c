/*
 * zipout: archives read back with libzip (names, contents, CRCs checked as it inflates), the
 * bytes reaching the sink in bounded pieces while an entry is written, a failing sink.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

#include "testhelp.h"
#include "zipout.h"

static char dir[256];

typedef struct file_sink {
    FILE *f;
    size_t calls, largest, total;
    size_t fail_after; /* 0: never */
} file_sink;

static qn_status to_file(void *arg, const void *data, size_t len)
{
    file_sink *s = arg;
    if (s->fail_after && s->total + len > s->fail_after)
        return QN_ECONFLICT; /* any status: the archive must hand it back */
    s->calls++;
    s->total += len;
    if (len > s->largest)
        s->largest = len;
    return fwrite(data, 1, len, s->f) == len ? QN_OK : QN_ERR;
}

/* Entry name of path's archive, whole, NUL-terminated (free()), or NULL. */
static char *read_entry(const char *path, const char *name, size_t *len)
{
    int err = 0;
    zip_t *z = zip_open(path, ZIP_RDONLY | ZIP_CHECKCONS, &err);
    if (!z) {
        printf("  zip_open: error %d\n", err);
        return NULL;
    }
    zip_stat_t st;
    char *buf = NULL;
    zip_file_t *f = NULL;
    if (zip_stat(z, name, 0, &st) != 0 || !(f = zip_fopen(z, name, 0)))
        goto done;
    buf = malloc(st.size + 1);
    zip_int64_t n = buf ? zip_fread(f, buf, st.size) : -1;
    char extra;
    /* Reading past the end makes libzip compare the CRC. */
    if (n != (zip_int64_t)st.size || zip_fread(f, &extra, 1) != 0) {
        printf("  %s: short read or bad CRC: %s\n", name, zip_file_strerror(f));
        free(buf);
        buf = NULL;
        goto done;
    }
    buf[n] = '\0';
    *len = (size_t)n;
done:
    if (f)
        zip_fclose(f);
    zip_discard(z);
    return buf;
}

static void test_two_entries(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/two.zip", dir);
    file_sink s = {.f = fopen(path, "wb")};
    zipout *z = zipout_new(to_file, &s, 6);
    CHECK(z != NULL && s.f != NULL);
    CHECK_EQ_INT(zipout_begin(z, "a.txt"), QN_OK);
    CHECK_EQ_INT(zipout_write(z, "hello, ", 7), QN_OK);
    CHECK_EQ_INT(zipout_write(z, "world", 5), QN_OK);
    CHECK_EQ_INT(zipout_begin(z, "dir/empty"), QN_OK);
    CHECK_EQ_INT(zipout_begin(z, "b.bin"), QN_OK);
    unsigned char bin[1000];
    for (size_t i = 0; i < sizeof(bin); i++)
        bin[i] = (unsigned char)(i * 7919 >> 3);
    CHECK_EQ_INT(zipout_write(z, bin, sizeof(bin)), QN_OK);
    CHECK_EQ_INT(zipout_finish(z), QN_OK);
    zipout_free(z);
    fclose(s.f);
    size_t len = 0;
    char *a = read_entry(path, "a.txt", &len);
    CHECK(a && len == 12 && strcmp(a, "hello, world") == 0);
    free(a);
    char *e = read_entry(path, "dir/empty", &len);
    CHECK(e && len == 0);
    free(e);
    char *b = read_entry(path, "b.bin", &len);
    CHECK(b && len == sizeof(bin) && memcmp(b, bin, len) == 0);
    free(b);
}

/* 64 MiB through one entry: the sink gets it as it comes, never more than a buffer at once. */
static void test_streams_in_pieces(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/big.zip", dir);
    file_sink s = {.f = fopen(path, "wb")};
    zipout *z = zipout_new(to_file, &s, 1);
    CHECK_EQ_INT(zipout_begin(z, "big.xml"), QN_OK);
    char line[128];
    size_t total = 0, calls_before_end = 0;
    uint32_t x = 12345;
    while (total < (64u << 20)) {
        x = x * 1103515245u + 12345u;
        int n = snprintf(line, sizeof(line), "<row r=\"%zu\"><c><v>%u</v></c></row>", total, x);
        CHECK_EQ_INT(zipout_write(z, line, (size_t)n), QN_OK);
        total += (size_t)n;
    }
    calls_before_end = s.calls;
    CHECK_EQ_INT(zipout_finish(z), QN_OK);
    zipout_free(z);
    fclose(s.f);
    printf("  %zu bytes in, %zu out in %zu sink calls (largest %zu)\n", total, s.total, s.calls,
           s.largest);
    CHECK(calls_before_end > 100); /* streamed, not held to the end */
    CHECK(s.largest <= 64u << 10);
    size_t len = 0;
    char *big = read_entry(path, "big.xml", &len);
    CHECK(big && len == total);
    free(big);
}

static void test_failing_sink(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/fail.zip", dir);
    file_sink s = {.f = fopen(path, "wb"), .fail_after = 100};
    zipout *z = zipout_new(to_file, &s, 1);
    CHECK_EQ_INT(zipout_begin(z, "a-rather-long-entry-name-to-pass-the-first-hundred-bytes.txt"),
                 QN_OK);
    CHECK_EQ_INT(zipout_begin(z, "second-entry-whose-header-does-not-fit-any-more.txt"),
                 QN_ECONFLICT);
    CHECK_EQ_INT(zipout_write(z, "x", 1), QN_ECONFLICT); /* sticky */
    CHECK_EQ_INT(zipout_finish(z), QN_ECONFLICT);
    zipout_free(z);
    fclose(s.f);
    CHECK(s.total <= 100);
}

int main(void)
{
    th_tmpdir(dir, sizeof(dir), "zipout-test");
    RUN(test_two_entries);
    RUN(test_streams_in_pieces);
    RUN(test_failing_sink);
    th_rmtree(dir);
    TEST_MAIN_END();
}
