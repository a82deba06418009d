/*
 * Fuzz target: the XML of an .xlsx (common/sheet/xlsx, common/sheet/rowcount, common/sheet/cellrow)
 * without the zip in the way. The input is the first sheet's XML, then optionally a NUL byte and
 * the shared strings' XML; the target packs them as stored (uncompressed) entries of a workbook
 * whose other parts are fixed, so every mutation reaches expat, the row reader and the row-count
 * scanner rather than a CRC or deflate error.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zip.h>

#include "sheetfuzz.h"

static const char workbook[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n"
    "<workbook xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\" "
    "xmlns:r=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships\">"
    "<sheets><sheet name=\"Sheet1\" sheetId=\"1\" r:id=\"rId1\"/></sheets></workbook>";

static const char rels_head[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n"
    "<Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\">"
    "<Relationship Id=\"rId1\" "
    "Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet\" "
    "Target=\"worksheets/sheet1.xml\"/>";
static const char rels_sst[] =
    "<Relationship Id=\"rId2\" "
    "Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings\" "
    "Target=\"sharedStrings.xml\"/>";
static const char rels_tail[] = "</Relationships>";

/* Adds a stored entry holding len bytes of data (copied by libzip when the archive closes). */
static int add(zip_t *z, const char *name, const void *data, size_t len)
{
    zip_source_t *src = zip_source_buffer(z, data, len, 0);
    if (!src)
        return -1;
    zip_int64_t idx = zip_file_add(z, name, src, ZIP_FL_OVERWRITE);
    if (idx < 0) {
        zip_source_free(src);
        return -1;
    }
    return zip_set_file_compression(z, (zip_uint64_t)idx, ZIP_CM_STORE, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = sheetfuzz_scratch();
    const uint8_t *nul = memchr(data, '\0', size);
    size_t sheet_len = nul ? (size_t)(nul - data) : size;
    char rels[sizeof(rels_head) + sizeof(rels_sst) + sizeof(rels_tail)];
    snprintf(rels, sizeof(rels), "%s%s%s", rels_head, nul ? rels_sst : "", rels_tail);

    int zerr = 0;
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zerr);
    if (!z || add(z, "xl/workbook.xml", workbook, strlen(workbook)) != 0 ||
        add(z, "xl/_rels/workbook.xml.rels", rels, strlen(rels)) != 0 ||
        add(z, "xl/worksheets/sheet1.xml", data, sheet_len) != 0 ||
        (nul && add(z, "xl/sharedStrings.xml", nul + 1, size - sheet_len - 1) != 0) ||
        zip_close(z) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", path, z ? zip_strerror(z) : "zip_open");
        abort();
    }
    sheetfuzz_read(path);
    return 0;
}
