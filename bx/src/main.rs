//! `bx`: the ByteExpress command-line tool (`bx devices`, `bx pingpong`, `bx ps serve`, `bx ps bench`); see
//! [`byteexpress::cli`].

fn main() -> std::process::ExitCode {
    byteexpress::cli::main()
}
