//! The view boilerplate every fixed-length header shares.

/// Defines a zero-copy view `$name<T: AsRef<[u8]>>` over a header of `$len`
/// bytes, with the smoltcp contract: `new_checked` verifies the length once,
/// after which accessors index without failing.
macro_rules! header_view {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of this header on the wire, in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; accessors panic
            /// if it is shorter than [`Self::LEN`].
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking that it holds the whole header.
            ///
            /// # Errors
            /// [`WireError::Truncated`](crate::WireError::Truncated) if it is
            /// shorter than [`Self::LEN`].
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                if buffer.as_ref().len() < $len {
                    Err(crate::WireError::Truncated)
                } else {
                    Ok(Self { buffer })
                }
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes (exactly [`Self::LEN`]).
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..$len]
            }

            #[inline]
            fn raw(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            #[inline]
            #[allow(dead_code)]
            fn raw_mut(&mut self) -> &mut [u8] {
                self.buffer.as_mut()
            }
        }
    };
}

pub(crate) use header_view;
