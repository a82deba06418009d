/*
 * Fuzz target: a distribution spreadsheet as uploaded, byte for byte (common/sheet/sheet): an .xlsx
 * when it starts with the zip magic, a .csv otherwise. The corpus holds real small workbooks;
 * mutating a zip mostly exercises libzip's checks and the package's relationships, which is
 * what an upload meets first (fuzz_xlsx reaches the XML readers past deflate and CRCs).
 */
#include <stdint.h>
#include <stdio.h>

#include "sheetfuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = sheetfuzz_scratch();
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(path);
        abort();
    }
    sheetfuzz_read(path);
    return 0;
}
