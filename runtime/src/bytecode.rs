//! Compiled JavaScript: QuickJS bytecode, made once and loaded into each VM instead of parsing the
//! same text again. Parsing the script API (`prelude.js`, about 8 KB) and the script on every VM
//! start was a tenth of a node's CPU with 32 workflows running.
//!
//! Bytecode is immutable bytes: a VM reads its own copy into its own runtime, so nothing of one
//! VM's state reaches another through it. Only bytecode QuickJS wrote here is ever read (QuickJS
//! does not check bytecode it reads). [`ScriptCache`] keeps the bytecode of recent scripts by
//! their content (a SHA-256 digest) and of the limits they were compiled under, so a script that
//! passed the launch's compile check starts from it, and so do the workflows of the same script.
//!
//! The crate's `unsafe` calls of QuickJS (`JS_Eval` to compile without running, `JS_WriteObject`,
//! `JS_ReadObject`, `JS_EvalFunction`) are all here.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::rc::Rc;
use std::sync::OnceLock;

use rquickjs::{CatchResultExt, CaughtError, Context, Ctx, Runtime, qjs};
use sha2::{Digest, Sha256};

use crate::Limits;
use crate::allocator::{CountingAllocator, Held};
use crate::error::Error;

/// What a context that only compiles needs: `JS_Eval` itself, and the regular-expression
/// compiler, without which QuickJS's parser refuses every regular-expression literal ("RegExp
/// are not supported").
type CompileOnly = (
    rquickjs::context::intrinsic::Eval,
    rquickjs::context::intrinsic::RegExpCompiler,
);

/// The script API every VM runs first (it captures the host functions, then hides them).
pub(crate) const PRELUDE: &str = include_str!("prelude.js");
/// The file name errors and stack traces show for the script.
pub(crate) const SCRIPT_FILE: &CStr = c"script";
/// The file name of the script API's own frames (what `Ctx::eval` calls a script it evaluates).
const PRELUDE_FILE: &CStr = c"eval_script";

/// The text a script is compiled as: the body of an async function of `args`, opening on the
/// script's first line so that an error's line number is the script's own (on the first line,
/// the column counts the prefix, which [`compile_error`] takes off).
pub(crate) const BODY_PREFIX: &str = "(async function (args) {";
/// On a line of its own, so that a comment on the script's last line ends before it.
const BODY_SUFFIX: &str = "\n})";

fn body_source(script: &str) -> String {
    format!("{BODY_PREFIX}{script}{BODY_SUFFIX}")
}

/// How code is compiled: the script's body is sloppy, as a `Function` body would be; the prelude
/// is strict (as `Ctx::eval` compiled it).
#[derive(Clone, Copy)]
enum Mode {
    Sloppy,
    Strict,
}

/// Compiles `source` as global code into a function object without running any of it: the
/// caller owns the result. rquickjs compiles without running only modules, which are strict, and
/// a workflow body is not; so this calls QuickJS's `JS_Eval` with `JS_EVAL_FLAG_COMPILE_ONLY`.
fn compile<'js>(
    ctx: &Ctx<'js>,
    source: &str,
    file: &CStr,
    mode: Mode,
) -> rquickjs::Result<rquickjs::Value<'js>> {
    let text = CString::new(source)?;
    let mut flags = qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_COMPILE_ONLY;
    if matches!(mode, Mode::Strict) {
        flags |= qjs::JS_EVAL_FLAG_STRICT;
    }
    // SAFETY: `text` and `file` are NUL-terminated and outlive the call, and `text` holds
    // `source.len()` bytes before its NUL, as JS_Eval requires. JS_Eval returns a value the caller
    // owns; `Value::from_raw` takes that ownership and frees it on drop.
    let compiled = unsafe {
        let raw = qjs::JS_Eval(
            ctx.as_raw().as_ptr(),
            text.as_ptr(),
            source.len() as _,
            file.as_ptr(),
            flags as i32,
        );
        rquickjs::Value::from_raw(ctx.clone(), raw)
    };
    if compiled.is_exception() {
        Err(rquickjs::Error::Exception)
    } else {
        Ok(compiled)
    }
}

/// The bytecode of a compiled function object (from [`compile`]), debug information and source
/// kept, so that errors and stack traces read as if the text had been evaluated.
fn write(ctx: &Ctx<'_>, compiled: &rquickjs::Value<'_>) -> rquickjs::Result<Rc<[u8]>> {
    let mut len: qjs::size_t = 0;
    // SAFETY: `compiled` is a live value of this context (it holds a reference for the call);
    // JS_WriteObject only reads it, and returns a buffer of `len` bytes allocated in the context
    // (or null with an exception pending), which is copied and then freed with `js_free`.
    unsafe {
        let buffer = qjs::JS_WriteObject(
            ctx.as_raw().as_ptr(),
            &mut len,
            compiled.as_raw(),
            qjs::JS_WRITE_OBJ_BYTECODE as i32,
        );
        if buffer.is_null() {
            return Err(rquickjs::Error::Exception);
        }
        let bytes = Rc::from(std::slice::from_raw_parts(buffer, len as usize));
        qjs::js_free(ctx.as_raw().as_ptr(), buffer.cast());
        Ok(bytes)
    }
}

/// Runs the function object [`compile`] made (consuming it): what evaluating its text would do.
fn evaluate<'js>(
    ctx: &Ctx<'js>,
    compiled: rquickjs::Value<'js>,
) -> rquickjs::Result<rquickjs::Value<'js>> {
    // SAFETY: JS_EvalFunction takes (and frees) a reference to the function object, so it is
    // given one of its own (`compiled` drops the one it holds); it returns a value the caller
    // owns, which `Value::from_raw` takes.
    let value = unsafe {
        let function = qjs::JS_DupValue(ctx.as_raw().as_ptr(), compiled.as_raw());
        let raw = qjs::JS_EvalFunction(ctx.as_raw().as_ptr(), function);
        rquickjs::Value::from_raw(ctx.clone(), raw)
    };
    if value.is_exception() {
        Err(rquickjs::Error::Exception)
    } else {
        Ok(value)
    }
}

/// Reads bytecode [`write`] made back into a function object of this context, and runs it.
fn load<'js>(ctx: &Ctx<'js>, bytecode: &[u8]) -> rquickjs::Result<rquickjs::Value<'js>> {
    // SAFETY: `bytecode` is only ever what `write` produced with this QuickJS (the prelude's, or
    // a script's kept in a `ScriptCache`): valid bytecode, which JS_ReadObject requires since it
    // does not check it. It copies what it keeps and returns a value the caller owns.
    let compiled = unsafe {
        let raw = qjs::JS_ReadObject(
            ctx.as_raw().as_ptr(),
            bytecode.as_ptr(),
            bytecode.len() as _,
            qjs::JS_READ_OBJ_BYTECODE as i32,
        );
        rquickjs::Value::from_raw(ctx.clone(), raw)
    };
    if compiled.is_exception() {
        return Err(rquickjs::Error::Exception);
    }
    evaluate(ctx, compiled)
}

/// The prelude's bytecode, compiled once per process (it is a constant).
fn prelude_bytecode() -> Result<&'static [u8], Error> {
    static PRELUDE_BYTECODE: OnceLock<Result<Box<[u8]>, Error>> = OnceLock::new();
    let compiled = PRELUDE_BYTECODE.get_or_init(|| {
        let runtime = rquickjs::Runtime::new().map_err(engine)?;
        let context = Context::custom::<CompileOnly>(&runtime).map_err(engine)?;
        context.with(|ctx| {
            compile(&ctx, PRELUDE, PRELUDE_FILE, Mode::Strict)
                .and_then(|compiled| write(&ctx, &compiled))
                .catch(&ctx)
                .map(|bytes| Box::from(&*bytes))
                .map_err(|e| Error::Engine(format!("the script API does not compile: {e}")))
        })
    });
    compiled.as_deref().map_err(Clone::clone)
}

/// Runs the script API (the prelude) in `ctx`, from its bytecode.
pub(crate) fn run_prelude(ctx: &Ctx<'_>) -> Result<(), Error> {
    let bytecode = prelude_bytecode()?;
    load(ctx, bytecode)
        .catch(ctx)
        .map(drop)
        .map_err(|e| Error::Engine(format!("the script API failed to install: {e}")))
}

/// What a script's bytecode is kept under: its text and the limits that bound its compile.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key([u8; 32]);

impl Key {
    fn of(script: &str, limits: &Limits) -> Key {
        let mut digest = Sha256::new();
        digest.update(limits.script_memory_bytes_max.to_le_bytes());
        digest.update(limits.script_stack_bytes_max.to_le_bytes());
        digest.update(script.as_bytes());
        Key(digest.finalize().into())
    }
}

struct Entry {
    bytecode: Rc<[u8]>,
    /// When it was last used, in the cache's own count of uses: the least recent goes first.
    used: u64,
}

/// The bytecode of up to `entries_max` scripts that compiled (the least recently used goes
/// first). A script found here passed the compile check under the same limits: neither the check
/// nor a VM start compiles it again. One per JS thread (bytecode is read on the thread that runs
/// the VM; the thread keeps it as `Rc`).
pub struct ScriptCache {
    entries_max: usize,
    entries: HashMap<Key, Entry>,
    uses: u64,
}

impl ScriptCache {
    /// A cache of at most `entries_max` scripts; 0 keeps none (every start compiles).
    pub fn new(entries_max: usize) -> ScriptCache {
        ScriptCache {
            entries_max,
            entries: HashMap::new(),
            uses: 0,
        }
    }

    /// How many scripts it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether it holds the bytecode of `script` compiled under `limits`.
    #[cfg(test)]
    pub(crate) fn holds(&self, script: &str, limits: &Limits) -> bool {
        self.entries.contains_key(&Key::of(script, limits))
    }

    fn get(&mut self, key: &Key) -> Option<Rc<[u8]>> {
        self.uses += 1;
        let entry = self.entries.get_mut(key)?;
        entry.used = self.uses;
        Some(Rc::clone(&entry.bytecode))
    }

    fn put(&mut self, key: Key, bytecode: Rc<[u8]>) {
        if self.entries_max == 0 {
            return;
        }
        if self.entries.len() >= self.entries_max && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.uses += 1;
        let used = self.uses;
        self.entries.insert(key, Entry { bytecode, used });
    }

    /// Checks that `script` compiles as a workflow body, without running any of it (no API is
    /// installed, nothing is evaluated) and within the script's size and memory limits; keeps its
    /// bytecode for the VMs that start it. The error names the script's own line and column.
    pub fn check(&mut self, script: &str, limits: &Limits) -> Result<(), Error> {
        check_size(script, limits)?;
        let key = Key::of(script, limits);
        if self.get(&key).is_some() {
            return Ok(());
        }
        let (runtime, _) = sandbox_runtime(limits, limits.script_memory_bytes_max)?;
        let context = Context::custom::<CompileOnly>(&runtime).map_err(engine)?;
        let bytecode = context.with(|ctx| {
            compile(&ctx, &body_source(script), SCRIPT_FILE, Mode::Sloppy)
                .and_then(|compiled| write(&ctx, &compiled))
                .catch(&ctx)
                .map_err(|e| Error::Script(compile_error(e)))
        })?;
        self.put(key, bytecode);
        Ok(())
    }

    /// Evaluates the script's body into the async function the prelude starts: from its bytecode
    /// when kept here, otherwise compiled in `ctx` (and kept).
    pub(crate) fn evaluate_body<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        script: &str,
        limits: &Limits,
    ) -> Result<rquickjs::Value<'js>, Error> {
        let key = Key::of(script, limits);
        if let Some(bytecode) = self.get(&key) {
            return load(ctx, &bytecode)
                .catch(ctx)
                .map_err(|e| Error::Script(compile_error(e)));
        }
        let compiled = compile(ctx, &body_source(script), SCRIPT_FILE, Mode::Sloppy)
            .catch(ctx)
            .map_err(|e| Error::Script(compile_error(e)))?;
        if self.entries_max > 0 {
            let bytecode = write(ctx, &compiled)
                .catch(ctx)
                .map_err(|e| Error::Script(compile_error(e)))?;
            self.put(key, bytecode);
        }
        evaluate(ctx, compiled)
            .catch(ctx)
            .map_err(|e| Error::Script(compile_error(e)))
    }
}

/// Refuses a script over `script_bytes_max`.
pub(crate) fn check_size(script: &str, limits: &Limits) -> Result<(), Error> {
    if script.len() as u64 > limits.script_bytes_max {
        return Err(Error::LimitExceeded(format!(
            "the script is {} bytes, over script_bytes_max ({})",
            script.len(),
            limits.script_bytes_max
        )));
    }
    Ok(())
}

pub(crate) fn engine(error: rquickjs::Error) -> Error {
    Error::Engine(error.to_string())
}

/// A runtime with the sandbox's memory and stack limits.
pub(crate) fn sandbox_runtime(
    limits: &Limits,
    memory_bytes: u64,
) -> Result<(Runtime, Held), Error> {
    let held = Held::default();
    let runtime = Runtime::new_with_alloc(CountingAllocator::new(held.clone())).map_err(engine)?;
    runtime.set_memory_limit(usize::try_from(memory_bytes).unwrap_or(usize::MAX));
    runtime
        .set_max_stack_size(usize::try_from(limits.script_stack_bytes_max).unwrap_or(usize::MAX));
    Ok((runtime, held))
}

/// A compile error in the script's own terms: the engine's message and the script's line and
/// column (from the error's `script:LINE:COLUMN` position).
pub(crate) fn compile_error(error: CaughtError<'_>) -> String {
    let CaughtError::Exception(exception) = error else {
        return format!("the script does not compile: {error}");
    };
    let name: String = exception
        .get("name")
        .unwrap_or_else(|_| "SyntaxError".to_owned());
    let message = exception.message().unwrap_or_default();
    let position = exception.stack().and_then(|stack| script_position(&stack));
    match position {
        Some((line, column)) => {
            format!("the script does not compile: {name}: {message} (line {line}, column {column})")
        }
        None => format!("the script does not compile: {name}: {message}"),
    }
}

/// The first `script:LINE:COLUMN` of a stack, in the script's own numbering.
fn script_position(stack: &str) -> Option<(u64, u64)> {
    let file = SCRIPT_FILE.to_str().ok()?;
    let at = stack.find(&format!("{file}:"))? + file.len() + 1;
    let mut numbers = stack[at..]
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u64>);
    let line = numbers.next()?.ok()?;
    let column = numbers.next()?.ok()?;
    let column = if line == 1 {
        column.saturating_sub(BODY_PREFIX.len() as u64)
    } else {
        column
    };
    Some((line, column))
}
