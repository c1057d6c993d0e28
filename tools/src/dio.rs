//! Direct I/O (O_DIRECT) support for the tools: what alignment a file needs, aligned
//! buffers, and which file system a path is on (for error messages).
//!
//! This module only answers questions and allocates; it performs no benchmark I/O. The WAL
//! has its own writer and does not depend on this module.

use std::alloc::{self, Layout};
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use serde::Serialize;

/// The smallest alignment the tools ever use for O_DIRECT buffers, positions and lengths,
/// in bytes: one page, and the physical block of every disk Quire targets.
pub const DIO_ALIGN_MIN: u64 = 4096;

/// The largest alignment accepted from the kernel, in bytes; anything larger is treated as
/// a reporting error rather than trusted.
pub const DIO_ALIGN_MAX: u64 = 1 << 20;

/// Where an alignment figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlignmentSource {
    /// `statx(STATX_DIOALIGN)` on the file itself (Linux 6.1+ on supporting file systems).
    Statx,
    /// The block device's logical and physical block sizes from sysfs.
    BlockDevice,
    /// Neither was available; [`DIO_ALIGN_MIN`] is used.
    Default,
}

impl fmt::Display for AlignmentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AlignmentSource::Statx => "statx",
            AlignmentSource::BlockDevice => "block device",
            AlignmentSource::Default => "default",
        })
    }
}

/// The direct-I/O alignment requirements of one open file, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DioAlignment {
    /// Required alignment of buffer addresses, from statx; `None` if the kernel did not say.
    pub mem_align: Option<u32>,
    /// Required alignment of file positions and lengths, from statx; `None` if the kernel did
    /// not say.
    pub offset_align: Option<u32>,
    /// The device's logical block size, if known.
    pub logical_block_size: Option<u32>,
    /// The device's physical block size, if known.
    pub physical_block_size: Option<u32>,
    /// Where the figures came from.
    pub source: AlignmentSource,
}

impl DioAlignment {
    /// The alignment to use for buffer addresses, file positions and lengths: the largest
    /// of every known requirement and [`DIO_ALIGN_MIN`]. Always a power of two.
    pub fn required(&self) -> u64 {
        [
            self.mem_align,
            self.offset_align,
            self.logical_block_size,
            self.physical_block_size,
        ]
        .into_iter()
        .flatten()
        .map(u64::from)
        .fold(DIO_ALIGN_MIN, u64::max)
        .next_power_of_two()
    }
}

/// Finds the direct-I/O alignment of `file` (a regular file on the file system under test).
///
/// Asks `statx(STATX_DIOALIGN)` first; if the kernel or file system does not answer, reads
/// the logical and physical block size of the device holding the file from
/// `/sys/dev/block/MAJ:MIN` (or its parent disk, for a partition); if neither is available,
/// uses [`DIO_ALIGN_MIN`]. The physical block size is read in every case.
///
/// # Errors
/// - `statx` itself failing (other than being unsupported).
/// - The file system answering statx with an offset alignment of 0, which means it does not
///   support O_DIRECT on this file (`ErrorKind::Unsupported`).
/// - A reported alignment that is not a power of two or exceeds [`DIO_ALIGN_MAX`].
pub fn detect_alignment(file: &File) -> io::Result<DioAlignment> {
    // SAFETY: statx is plain old data; all-zero is a valid value for every field.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open for the duration of the call (borrowed from `file`), the path
    // is a valid NUL-terminated empty string as AT_EMPTY_PATH requires, and `stx` is a
    // writable statx that outlives the call.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    let statx_ok = if rc == 0 {
        true
    } else {
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EINVAL) => false,
            _ => return Err(err),
        }
    };
    let (logical_block_size, physical_block_size) = if statx_ok {
        block_device_sizes(stx.stx_dev_major, stx.stx_dev_minor)
    } else {
        (None, None)
    };

    let alignment = if statx_ok && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        if stx.stx_dio_offset_align == 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the file system reports no direct I/O support for this file \
                 (statx dio_offset_align = 0)",
            ));
        }
        DioAlignment {
            mem_align: Some(stx.stx_dio_mem_align),
            offset_align: Some(stx.stx_dio_offset_align),
            logical_block_size,
            physical_block_size,
            source: AlignmentSource::Statx,
        }
    } else if logical_block_size.is_some() || physical_block_size.is_some() {
        DioAlignment {
            mem_align: None,
            offset_align: None,
            logical_block_size,
            physical_block_size,
            source: AlignmentSource::BlockDevice,
        }
    } else {
        DioAlignment {
            mem_align: None,
            offset_align: None,
            logical_block_size: None,
            physical_block_size: None,
            source: AlignmentSource::Default,
        }
    };
    for value in [
        alignment.mem_align,
        alignment.offset_align,
        alignment.logical_block_size,
        alignment.physical_block_size,
    ]
    .into_iter()
    .flatten()
    {
        if !value.is_power_of_two() || u64::from(value) > DIO_ALIGN_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "implausible direct I/O alignment {value} reported by {} (expected a \
                     power of two up to {DIO_ALIGN_MAX})",
                    alignment.source
                ),
            ));
        }
    }
    Ok(alignment)
}

/// Reads `logical_block_size` and `physical_block_size` of block device `major:minor` from
/// sysfs, looking at the parent disk when the device is a partition. `None` for each figure
/// that cannot be read (virtual file systems have no block device).
fn block_device_sizes(major: u32, minor: u32) -> (Option<u32>, Option<u32>) {
    let base = format!("/sys/dev/block/{major}:{minor}");
    let read = |name: &str| -> Option<u32> {
        [
            format!("{base}/queue/{name}"),
            format!("{base}/../queue/{name}"),
        ]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| text.trim().parse().ok())
    };
    (read("logical_block_size"), read("physical_block_size"))
}

/// Names the file system that holds `path` (`"ext4"`, `"tmpfs"`, ...), or its magic number
/// in hex when it is not one this function knows. Used in error messages.
///
/// # Errors
/// `statfs` failing, e.g. because `path` does not exist.
pub fn filesystem_name(path: &Path) -> io::Result<String> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: statfs is plain old data; all-zero is a valid value for every field.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a valid NUL-terminated string and `buf` a writable statfs, both
    // outliving the call.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut buf) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // f_type is a signed word holding a 32-bit magic; compare the low 32 bits.
    let magic = (buf.f_type as u64 & 0xffff_ffff) as u32;
    let name = match magic {
        0xef53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0xf2f5_2010 => "f2fs",
        0x2fc1_2fc1 => "zfs",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0x794c_7630 => "overlayfs",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0xff53_4d42 => "cifs",
        0x0102_1997 => "9p",
        _ => return Ok(format!("unknown file system (magic {magic:#x})")),
    };
    Ok(name.to_owned())
}

/// Free space available to this user on the file system holding `path`, in bytes.
///
/// # Errors
/// `statvfs` failing.
pub fn available_bytes(path: &Path) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value for every field.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a valid NUL-terminated string and `buf` a writable statvfs, both
    // outliving the call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut buf) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // Both fields are u64 on 64-bit Linux but narrower on some 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let (blocks, block_bytes) = (u64::from(buf.f_bavail), u64::from(buf.f_frsize));
    Ok(blocks.saturating_mul(block_bytes))
}

/// A heap buffer whose address is aligned for direct I/O. Zero-filled on allocation.
///
/// The allocation never moves: moving an `AlignedBuf` moves only its pointer, so a raw
/// pointer from [`AlignedBuf::as_ptr`] stays valid until the buffer is dropped. Code that
/// hands that pointer to the kernel must keep the buffer alive (or leak it) until the kernel
/// is done with it.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.layout.size())
            .field("align", &self.layout.align())
            .finish()
    }
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Box<[u8]>); no shared state.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads, as for Box<[u8]>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes at an address that is a multiple of `align`.
    ///
    /// # Panics
    /// If `len` is zero, `align` is not a power of two, or the rounded size overflows
    /// `isize` (all caller bugs). Aborts if memory is exhausted, like `Vec`.
    pub fn zeroed(len: usize, align: usize) -> Self {
        assert!(len > 0, "invariant: an aligned buffer is not empty");
        let layout = Layout::from_size_align(len, align)
            .expect("invariant: alignment is a power of two and the size fits isize");
        // SAFETY: the layout has a non-zero size (asserted above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self { ptr, layout }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: buffers are never empty. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The start address; aligned as requested, valid for [`AlignedBuf::len`] bytes while
    /// `self` lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, for reading.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed at allocation) bytes, owned by
        // self, and no mutable borrow exists while &self is held.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// The bytes, for filling.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len initialized bytes, owned by self, and &mut self
        // guarantees this is the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc_zeroed with exactly this layout and is freed
        // only here, once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        for align in [512usize, 4096, 65536] {
            let mut buf = AlignedBuf::zeroed(3 * align, align);
            assert_eq!(buf.as_ptr() as usize % align, 0);
            assert_eq!(buf.len(), 3 * align);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
            buf.as_mut_slice()[align] = 7;
            assert_eq!(buf.as_slice()[align], 7);
        }
    }

    #[test]
    fn required_alignment_is_the_largest_known_and_at_least_a_page() {
        let statx = DioAlignment {
            mem_align: Some(4),
            offset_align: Some(512),
            logical_block_size: Some(512),
            physical_block_size: Some(4096),
            source: AlignmentSource::Statx,
        };
        assert_eq!(statx.required(), 4096);
        let big = DioAlignment {
            physical_block_size: Some(16384),
            ..statx
        };
        assert_eq!(big.required(), 16384);
        let unknown = DioAlignment {
            mem_align: None,
            offset_align: None,
            logical_block_size: None,
            physical_block_size: None,
            source: AlignmentSource::Default,
        };
        assert_eq!(unknown.required(), DIO_ALIGN_MIN);
    }

    #[test]
    fn detects_alignment_of_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let alignment = detect_alignment(&file).unwrap();
        let required = alignment.required();
        assert!(required >= DIO_ALIGN_MIN && required.is_power_of_two());
        assert!(!filesystem_name(dir.path()).unwrap().is_empty());
        assert!(available_bytes(dir.path()).unwrap() > 0);
    }
}
