//! `bx`: the ByteExpress command-line tool (`bx devices`, `bx pingpong`, `bx ps serve`,
//! `bx ps bench`); the commands are [`bx::main`].

fn main() -> std::process::ExitCode {
    bx::main()
}
