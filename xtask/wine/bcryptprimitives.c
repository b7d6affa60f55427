/* ProcessPrng for Wine 8, which lacks bcryptprimitives.dll.
 *
 * Rust's standard library (1.78 and later) draws its random bytes (HashMap seeds) from
 * ProcessPrng in bcryptprimitives.dll, which Windows 10 and later ship. Wine 8.0 (Debian 12)
 * has no such DLL, so every Rust program for x86_64-pc-windows-gnu fails to start under it.
 * `cargo xtask windows` builds this file with mingw into the Wine prefix it tests in; it is
 * never shipped. BCryptGenRandom with the system RNG is what Windows' ProcessPrng gives too.
 */
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) {
            return FALSE;
        }
        data += n;
        len -= n;
    }
    return TRUE;
}
