//! Windows system calls of the named-pipe transport: the user (SID) a process runs as, and
//! the security descriptor of a pipe. The only unsafe code of this crate.
#![allow(unsafe_code)]

use std::io;
use std::os::windows::io::{AsRawHandle, BorrowedHandle};
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::{CloseHandle, ERROR_INSUFFICIENT_BUFFER, HANDLE, LocalFree};
use windows_sys::Win32::Security::Authorization::{
    ConvertSecurityDescriptorToStringSecurityDescriptorW, ConvertSidToStringSidW, GetSecurityInfo, SDDL_REVISION_1,
    SE_KERNEL_OBJECT,
};
use windows_sys::Win32::Security::{
    DACL_SECURITY_INFORMATION, GetTokenInformation, OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, TOKEN_QUERY,
    TOKEN_USER, TokenUser,
};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, OpenProcess, OpenProcessToken, PROCESS_QUERY_LIMITED_INFORMATION,
};

/// A handle closed on drop.
struct Owned(HANDLE);

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by this module and is closed once, here.
        unsafe { CloseHandle(self.0) };
    }
}

/// Reads a NUL-terminated UTF-16 string that `LocalAlloc` made, then frees it.
///
/// # Safety
/// `p` is a NUL-terminated UTF-16 string allocated with `LocalAlloc`, not used after.
unsafe fn take_local_wide(p: *mut u16) -> String {
    let mut n = 0;
    // SAFETY: the string is NUL-terminated (the caller's contract), so every read up to and
    // including the NUL is inside it.
    while unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: `n` UTF-16 units were just read from `p`.
    let s = String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(p, n) });
    // SAFETY: `p` came from LocalAlloc (the caller's contract) and is not used again.
    unsafe { LocalFree(p.cast()) };
    s
}

/// The string SID (`S-1-5-21-...`) of the user a process's token runs as.
fn token_user(process: HANDLE) -> io::Result<String> {
    let mut token: HANDLE = null_mut();
    // SAFETY: `process` is a live process handle with query rights; `token` receives a new
    // handle, owned (and closed) below.
    if unsafe { OpenProcessToken(process, TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let token = Owned(token);
    let mut len = 0u32;
    // SAFETY: a size query: no buffer, `len` receives the size needed.
    let ok = unsafe { GetTokenInformation(token.0, TokenUser, null_mut(), 0, &mut len) };
    if ok == 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(ERROR_INSUFFICIENT_BUFFER as i32) {
            return Err(e);
        }
    }
    // u64 words: aligned for TOKEN_USER (pointer-aligned).
    let mut buf = vec![0u64; (len as usize).div_ceil(8).max(1)];
    // SAFETY: `buf` holds at least `len` writable bytes.
    if unsafe { GetTokenInformation(token.0, TokenUser, buf.as_mut_ptr().cast(), len, &mut len) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call succeeded, so `buf` begins with a TOKEN_USER (suitably aligned),
    // whose SID pointer points into `buf`, alive for this function.
    let user = unsafe { &*buf.as_ptr().cast::<TOKEN_USER>() };
    let mut text: *mut u16 = null_mut();
    // SAFETY: `user.User.Sid` is a valid SID (above); `text` receives a LocalAlloc'ed string.
    if unsafe { ConvertSidToStringSidW(user.User.Sid, &mut text) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ConvertSidToStringSidW made a NUL-terminated LocalAlloc'ed string.
    Ok(unsafe { take_local_wide(text) })
}

/// The string SID of the user this process runs as.
pub(crate) fn current_user() -> io::Result<String> {
    // SAFETY: the pseudo-handle of this process; it needs no closing.
    token_user(unsafe { GetCurrentProcess() })
}

/// The string SID of the user process `pid` runs as.
pub(crate) fn process_user(pid: u32) -> io::Result<String> {
    // SAFETY: opening a process by id; a null handle is an error, a live one is owned below.
    let h = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
    if h.is_null() {
        return Err(io::Error::last_os_error());
    }
    let h = Owned(h);
    token_user(h.0)
}

/// The owner and access list of the object behind `handle` (a named pipe), in SDDL.
pub(crate) fn security_sddl(handle: BorrowedHandle<'_>) -> io::Result<String> {
    let info = OWNER_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION;
    let mut sd: PSECURITY_DESCRIPTOR = null_mut();
    // SAFETY: `handle` is live for the call; `sd` receives a LocalAlloc'ed descriptor, freed
    // below; the owner and DACL out-pointers are not asked for.
    let r = unsafe {
        GetSecurityInfo(
            handle.as_raw_handle(),
            SE_KERNEL_OBJECT,
            info,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            &mut sd,
        )
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r as i32));
    }
    let mut text: *mut u16 = null_mut();
    // SAFETY: `sd` is the valid descriptor just returned; `text` receives a LocalAlloc'ed
    // string.
    let ok = unsafe {
        ConvertSecurityDescriptorToStringSecurityDescriptorW(sd, SDDL_REVISION_1, info, &mut text, null_mut())
    };
    let e = io::Error::last_os_error();
    // SAFETY: `sd` came from GetSecurityInfo (LocalAlloc) and is not used again.
    unsafe { LocalFree(sd) };
    if ok == 0 {
        return Err(e);
    }
    // SAFETY: the conversion made a NUL-terminated LocalAlloc'ed string.
    Ok(unsafe { take_local_wide(text) })
}
