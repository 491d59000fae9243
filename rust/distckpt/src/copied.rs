//! The owned copy a view borrows from when the reader does not map its chunk: shared by the reader (which keeps the
//! copies) and the views (which make them), below both.

/// A chunk copied out of the checkpoint (views of a reader opened with `map_files: false`), 8-byte aligned.
pub(crate) struct CopiedChunk {
    pub(crate) words: Vec<u64>,
    pub(crate) len: usize,
}

impl CopiedChunk {
    pub(crate) fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }
}
