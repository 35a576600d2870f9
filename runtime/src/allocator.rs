//! The allocator every QuickJS runtime of reins uses: Rust's global allocator (mimalloc in the
//! `reins` binary, instead of the C library's malloc that QuickJS calls by default), with the
//! bytes a runtime holds counted as it allocates. The host reads a VM's size after each
//! activation; asking QuickJS (`JS_ComputeMemoryUsage`) walked every object, atom and shape of
//! the heap each time, about 4% of a node's CPU with 32 workflows running.

use std::cell::Cell;
use std::rc::Rc;

use rquickjs::allocator::{Allocator, RustAllocator};

/// Bytes held by one runtime's allocations, shared between its allocator and its VM.
#[derive(Clone, Default)]
pub(crate) struct Held(Rc<Cell<usize>>);

impl Held {
    pub(crate) fn bytes(&self) -> usize {
        self.0.get()
    }

    fn add(&self, bytes: usize) {
        self.0.set(self.0.get().saturating_add(bytes));
    }

    fn remove(&self, bytes: usize) {
        self.0.set(self.0.get().saturating_sub(bytes));
    }
}

/// [`RustAllocator`], counting into a [`Held`].
pub(crate) struct CountingAllocator {
    held: Held,
}

impl CountingAllocator {
    pub(crate) fn new(held: Held) -> CountingAllocator {
        CountingAllocator { held }
    }
}

// SAFETY: every call is passed to `RustAllocator`, which keeps the trait's contract; the counting
// only reads the usable size of pointers that allocator returned and has not freed yet.
unsafe impl Allocator for CountingAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        let ptr = RustAllocator.alloc(size);
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by `RustAllocator`.
            self.held.add(unsafe { RustAllocator::usable_size(ptr) });
        }
        ptr
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        let ptr = RustAllocator.calloc(count, size);
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by `RustAllocator`.
            self.held.add(unsafe { RustAllocator::usable_size(ptr) });
        }
        ptr
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        // SAFETY: the caller hands back a live allocation of this allocator (QuickJS never frees
        // a null pointer through it: rquickjs checks).
        unsafe {
            self.held.remove(RustAllocator::usable_size(ptr));
            RustAllocator.dealloc(ptr);
        }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; QuickJS reallocates only live, non-null allocations
        // (`js_realloc_rt` turns a null pointer into a malloc and a size of 0 into a free).
        unsafe {
            let old = RustAllocator::usable_size(ptr);
            let moved = RustAllocator.realloc(ptr, new_size);
            if !moved.is_null() {
                self.held.remove(old);
                self.held.add(RustAllocator::usable_size(moved));
            }
            moved
        }
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: as the caller promises for this trait method.
        unsafe { RustAllocator::usable_size(ptr) }
    }
}
