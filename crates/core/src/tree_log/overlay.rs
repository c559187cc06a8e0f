//! A copy-on-write device over another: reads see the writes made through it, the
//! device below is never written. A read-only open replays a tree log into it.

use crate::io::dev::Device;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

/// Granule of the overlay: writes are kept in pages of this size.
const PAGE: u64 = 4096;

/// A device whose writes go to memory (pages of 4 KiB), over a device that is only
/// read. `flush` does nothing: nothing here is durable, by design.
#[derive(Debug)]
pub(crate) struct CowDevice {
    base: Arc<dyn Device>,
    pages: Mutex<HashMap<u64, Box<[u8]>>>,
}

impl CowDevice {
    pub(crate) fn new(base: Arc<dyn Device>) -> CowDevice {
        CowDevice {
            base,
            pages: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, HashMap<u64, Box<[u8]>>>> {
        self.pages
            .lock()
            .map_err(|_| io::Error::other("overlay lock poisoned"))
    }
}

impl Device for CowDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let pages = self.lock()?;
        if pages.is_empty() {
            drop(pages);
            return self.base.read_at(offset, buf);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let page = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            match pages.get(&page) {
                Some(p) => buf[done..done + n].copy_from_slice(&p[in_page..in_page + n]),
                None => {
                    // Read the run of pages not in the overlay in one call.
                    let mut end = done + n;
                    while end < buf.len() {
                        let next = (offset + end as u64) / PAGE;
                        if pages.contains_key(&next) {
                            break;
                        }
                        end = (end + PAGE as usize).min(buf.len());
                    }
                    self.base.read_at(pos, &mut buf[done..end])?;
                    done = end;
                    continue;
                }
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if offset + buf.len() as u64 > self.size() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "write past the end of the device",
            ));
        }
        let mut pages = self.lock()?;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let page = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            let p = match pages.entry(page) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let mut p = vec![0u8; PAGE as usize];
                    let len = (self.base.size() - page * PAGE).min(PAGE) as usize;
                    self.base.read_at(page * PAGE, &mut p[..len])?;
                    e.insert(p.into_boxed_slice())
                }
            };
            p[in_page..in_page + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.base.size()
    }

    fn name(&self) -> String {
        self.base.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::dev::MemDevice;

    #[test]
    fn writes_stay_in_the_overlay() {
        let base = MemDevice::new((0..20000u32).map(|i| i as u8).collect(), "m");
        let cow = CowDevice::new(base.clone());
        cow.write_at(4000, &[0xaa; 200]).unwrap();
        let mut b = vec![0u8; 20000];
        cow.read_at(0, &mut b).unwrap();
        for (i, v) in b.iter().enumerate() {
            let want = if (4000..4200).contains(&i) {
                0xaa
            } else {
                i as u8
            };
            assert_eq!(*v, want, "byte {i}");
        }
        assert_eq!(base.snapshot()[4000], (4000u32 & 0xff) as u8);
        let mut c = vec![0u8; 10];
        cow.read_at(4195, &mut c).unwrap();
        assert_eq!(&c[..5], &[0xaa; 5]);
        assert_eq!(c[5], (4200u32 & 0xff) as u8);
    }
}
