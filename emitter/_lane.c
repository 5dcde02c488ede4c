/* emitter._lane: the compiled fast path of the calls a training loop makes every step.

A recorder's per-step calls (record_step_start_time, record_model_metrics and the data-loading
span) run in the training loop, whose step has left the caches cold by the time they run: each
object, page and function a call touches costs a memory access. Here such a call reads its
arguments, stamps the time and writes fixed-size numbers into a slot of a preallocated ring: it
creates no Python object and runs no bytecode. The worker's thread turns the ring's slots into
records (emitter.worker) later, in one warm pass.

Two types:

- Lane: the front of a worker's queue. A ring of slots, each a per-step event's numbers or any
  other event's (kind, body) objects, in the order recorded; the sequence numbers of the attempt,
  drawn here, one at a time under the GIL (a signal handler runs only between bytecodes, never
  inside these functions); the room the worker leaves for the callers (room), past which a call
  takes the slow path; and when to wake the worker's thread for a full batch (wake, wake_at).
- FastPath: the base class of GoodputRecorder. Its four per-step methods record into its lane
  (_lane) when the call is plain (the step an int, the metrics floats or None, no explicit time)
  and the lane has room; every other call, and every call while _lane is None (recording off,
  closed, or an injected clock), goes to the recorder's Python method of the same signature
  (_slow_step_start, ...), which checks, converts, counts and logs as the recorder does. So does
  a call that does not fit the method's signature: no call raises into the training loop.

And one function, encode_events: the worker thread's goodput_schemas.wire.encode_events for a
batch of those events, written here rather than through a dict per event (emitter.lane).

emitter/lane.py holds the same two types in Python, used where this module was not built: the
two must stay alike, and the emitter's tests run against both. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <ctype.h>
#include <math.h>
#include <time.h>

enum { SLOT_OBJECT, SLOT_STEP_START, SLOT_MODEL_METRICS, SLOT_DATA_LOADING_START, SLOT_DATA_LOADING_END };

/* The model metrics of a model_metrics event, in the order of its compact body (wire.MODEL_METRICS). */
#define N_METRICS 6
static const char *const METRIC_NAMES[N_METRICS] = {
    "loss", "step_time_s", "tokens_per_s", "samples_per_s", "mfu", "tflops_per_device"};

typedef struct {
    long long seq;
    long long time_us;
    unsigned char type;
    unsigned char present; /* model metrics: bit i set if METRIC_NAMES[i] was given */
    union {
        struct {
            long long step;
            double values[N_METRICS];
        } numbers;
        struct {
            PyObject *kind; /* owned */
            PyObject *body; /* owned */
        } object;
    };
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    Py_ssize_t capacity;
    Py_ssize_t count;
    Py_ssize_t room;
    Py_ssize_t wake_at;
    PyObject *wake; /* called (no arguments) when count reaches wake_at; NULL: never */
    long long next_seq;
    long long max_count; /* the largest step the fast path takes (limits.MAX_COUNT) */
    int taking;
} Lane;

typedef struct {
    PyObject_HEAD
    Lane *lane; /* NULL: every call takes the slow path */
} FastPath;

static PyTypeObject LaneType;

/* Interned at import: kinds of records, names of parameters and of the slow methods. */
static PyObject *KIND_STEP_START, *KIND_MODEL_METRICS, *KIND_DATA_LOADING_START, *KIND_DATA_LOADING_END;
static PyObject *NAME_STEP, *NAME_START_TIME, *NAME_END_TIME, *NAME_TIME_;
static PyObject *METRIC_NAME_OBJECTS[N_METRICS];
static PyObject *SLOW_STEP_START, *SLOW_MODEL_METRICS, *SLOW_DATA_LOADING_START, *SLOW_DATA_LOADING_END;

/* -- Lane ------------------------------------------------------------------------------------ */

static void
slot_clear(Slot *slot)
{
    if (slot->type == SLOT_OBJECT) {
        Py_CLEAR(slot->object.kind);
        Py_CLEAR(slot->object.body);
    }
}

static PyObject *
Lane_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"capacity", "max_count", "wake", NULL};
    Py_ssize_t capacity;
    long long max_count;
    PyObject *wake = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nL|O:Lane", keywords, &capacity, &max_count, &wake)) {
        return NULL;
    }
    if (wake != Py_None && !PyCallable_Check(wake)) {
        PyErr_SetString(PyExc_TypeError, "Lane: wake must be callable or None");
        return NULL;
    }
    if (capacity < 1 || max_count < 0) {
        PyErr_SetString(PyExc_ValueError, "Lane: capacity must be >= 1 and max_count >= 0");
        return NULL;
    }
    Lane *self = (Lane *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->slots = PyMem_Calloc((size_t)capacity, sizeof(Slot));
    if (self->slots == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->capacity = capacity;
    self->max_count = max_count;
    self->wake_at = PY_SSIZE_T_MAX;
    self->wake = wake == Py_None ? NULL : Py_NewRef(wake);
    return (PyObject *)self;
}

static int
Lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->wake);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (self->slots[i].type == SLOT_OBJECT) {
            Py_VISIT(self->slots[i].object.kind);
            Py_VISIT(self->slots[i].object.body);
        }
    }
    return 0;
}

static int
Lane_clear(Lane *self)
{
    /* Only the garbage collector breaking a cycle, or the lane's end, drops queued events. */
    Py_ssize_t count = self->count;
    self->count = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        slot_clear(&self->slots[i]);
    }
    Py_CLEAR(self->wake);
    return 0;
}

static void
Lane_dealloc(Lane *self)
{
    PyObject_GC_UnTrack(self);
    Lane_clear(self);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The next free slot, numbered, if the callers have room; else NULL. The caller fills it, then
   calls Lane_filled. */
static inline Slot *
Lane_claim(Lane *self)
{
    if (self->count >= self->room) {
        return NULL;
    }
    Slot *slot = &self->slots[self->count++];
    slot->seq = self->next_seq++;
    return slot;
}

/* Wakes the worker's thread when the lane holds a batch. A failed wake (the thread woken
   already) is nothing to report. */
static inline void
Lane_filled(Lane *self)
{
    if (self->count == self->wake_at && self->wake != NULL) {
        PyObject *done = PyObject_CallNoArgs(self->wake);
        if (done == NULL) {
            PyErr_Clear();
        }
        Py_XDECREF(done);
    }
}

PyDoc_STRVAR(Lane_put_doc,
"put($self, time_us, kind, body, /)\n--\n\n"
"Queues the event (time_us, kind, body) under the next sequence number if the callers have\n"
"room; returns whether it did.");

static PyObject *
Lane_put(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "put() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    long long time_us = PyLong_AsLongLong(args[0]);
    if (time_us == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Slot *slot = Lane_claim(self);
    if (slot == NULL) {
        Py_RETURN_FALSE;
    }
    slot->time_us = time_us;
    slot->type = SLOT_OBJECT;
    slot->object.kind = Py_NewRef(args[1]);
    slot->object.body = Py_NewRef(args[2]);
    Lane_filled(self);
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(Lane_draw_into_doc,
"draw_into($self, slot, /)\n--\n\n"
"Appends the next sequence number to the list slot, for an event queued elsewhere (the worker's\n"
"slow path): in one step, so that no signal handler runs between the number's drawing and its\n"
"being seen where the worker looks for it.");

static PyObject *
Lane_draw_into(Lane *self, PyObject *slot)
{
    if (!PyList_Check(slot)) {
        PyErr_Format(PyExc_TypeError, "draw_into() takes a list, not %.100s", Py_TYPE(slot)->tp_name);
        return NULL;
    }
    PyObject *seq = PyLong_FromLongLong(self->next_seq);
    if (seq == NULL) {
        return NULL;
    }
    int failed = PyList_Append(slot, seq);
    Py_DECREF(seq);
    if (failed) {
        return NULL;
    }
    self->next_seq++;
    Py_RETURN_NONE;
}

/* The record (seq, time_us, kind, body) of a slot, as emitter.recorder queues it; NULL (no
   memory) leaves the slot as it was. */
static PyObject *
slot_record(const Slot *slot)
{
    PyObject *kind, *body;
    switch (slot->type) {
    case SLOT_OBJECT:
        kind = Py_NewRef(slot->object.kind);
        body = Py_NewRef(slot->object.body);
        break;
    case SLOT_STEP_START:
        kind = Py_NewRef(KIND_STEP_START);
        body = PyLong_FromLongLong(slot->numbers.step);
        break;
    case SLOT_MODEL_METRICS:
        kind = Py_NewRef(KIND_MODEL_METRICS);
        body = PyTuple_New(1 + N_METRICS);
        for (int i = 0; body != NULL && i <= N_METRICS; i++) {
            PyObject *value = i == 0 ? PyLong_FromLongLong(slot->numbers.step)
                : (slot->present & (1u << (i - 1))) ? PyFloat_FromDouble(slot->numbers.values[i - 1])
                : Py_NewRef(Py_None);
            if (value == NULL) {
                Py_CLEAR(body);
            } else {
                PyTuple_SET_ITEM(body, i, value);
            }
        }
        break;
    default:
        kind = Py_NewRef(slot->type == SLOT_DATA_LOADING_START ? KIND_DATA_LOADING_START
                                                               : KIND_DATA_LOADING_END);
        body = PyDict_New();
    }
    PyObject *seq = PyLong_FromLongLong(slot->seq);
    PyObject *time_us = PyLong_FromLongLong(slot->time_us);
    PyObject *record = NULL;
    if (seq != NULL && time_us != NULL && body != NULL) {
        record = PyTuple_Pack(4, seq, time_us, kind, body);
    }
    Py_XDECREF(seq);
    Py_XDECREF(time_us);
    Py_DECREF(kind);
    Py_XDECREF(body);
    return record;
}

PyDoc_STRVAR(Lane_take_doc,
"take($self, /)\n--\n\n"
"Empties the lane: its events as records (seq, time_us, kind, body), in the order queued.");

static PyObject *
Lane_take(Lane *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *records = PyList_New(0);
    if (records == NULL || self->taking) {
        return records;  /* a take within a take (a finalizer its allocations ran): the outer takes all */
    }
    self->taking = 1;
    Py_ssize_t taken = 0;
    /* count is read again each time: what a finalizer queues meanwhile is taken too. */
    while (taken < self->count) {
        PyObject *record = slot_record(&self->slots[taken]);
        if (record == NULL || PyList_Append(records, record) < 0) {
            Py_XDECREF(record);
            break;  /* no memory: the rest stay queued */
        }
        Py_DECREF(record);
        slot_clear(&self->slots[taken]);
        taken++;
    }
    memmove(self->slots, self->slots + taken, (size_t)(self->count - taken) * sizeof(Slot));
    self->count -= taken;
    self->taking = 0;
    if (PyErr_Occurred()) {
        if (taken == 0) {
            Py_DECREF(records);
            return NULL;
        }
        PyErr_Clear();  /* what was taken is returned; the next take tries the rest again */
    }
    return records;
}

PyDoc_STRVAR(Lane_take_into_doc,
"take_into($self, queue, /)\n--\n\n"
"Empties the lane onto the end of queue (anything with extend), in one step: a signal handler\n"
"never finds the lane's events in neither.");

static PyObject *
Lane_take_into(Lane *self, PyObject *queue)
{
    PyObject *records = Lane_take(self, NULL);
    if (records == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_CallMethod(queue, "extend", "O", records);
    Py_DECREF(records);
    return result;
}

static Py_ssize_t
Lane_length(Lane *self)
{
    return self->count;
}

static PyObject *
Lane_get_room(Lane *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->room);
}

static int
Lane_set_room(Lane *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "room cannot be deleted");
        return -1;
    }
    Py_ssize_t room = PyLong_AsSsize_t(value);
    if (room == -1 && PyErr_Occurred()) {
        return -1;
    }
    self->room = room < 0 ? 0 : room > self->capacity ? self->capacity : room;
    return 0;
}

static PyMethodDef Lane_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Lane_put, METH_FASTCALL, Lane_put_doc},
    {"draw_into", (PyCFunction)Lane_draw_into, METH_O, Lane_draw_into_doc},
    {"take", (PyCFunction)Lane_take, METH_NOARGS, Lane_take_doc},
    {"take_into", (PyCFunction)Lane_take_into, METH_O, Lane_take_into_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Lane_getset[] = {
    {"room", (getter)Lane_get_room, (setter)Lane_set_room,
     "How many events the lane may hold before a call takes the slow path (0 to capacity).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Lane_members[] = {
    {"wake_at", T_PYSSIZET, offsetof(Lane, wake_at), 0,
     "The lane calls wake when a put brings it to this many events."},
    {"next_seq", T_LONGLONG, offsetof(Lane, next_seq), READONLY,
     "The next sequence number: how many were drawn."},
    {"capacity", T_PYSSIZET, offsetof(Lane, capacity), READONLY, "Slots of the ring."},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods Lane_as_sequence = {
    .sq_length = (lenfunc)Lane_length,
};

PyDoc_STRVAR(Lane_doc,
"Lane(capacity, max_count, wake=None)\n--\n\n"
"The front of a worker's queue: events in the order recorded, numbered as they come.");

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emitter._lane.Lane",
    .tp_doc = Lane_doc,
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Lane_new,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_traverse = (traverseproc)Lane_traverse,
    .tp_clear = (inquiry)Lane_clear,
    .tp_methods = Lane_methods,
    .tp_getset = Lane_getset,
    .tp_members = Lane_members,
    .tp_as_sequence = &Lane_as_sequence,
};

/* -- FastPath -------------------------------------------------------------------------------- */

/* The time now as time.time_ns() // 1000 gives it; -1 if the clock cannot be read. */
static inline long long
now_us(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        return -1;
    }
    return (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
}

static inline int
same_name(PyObject *given, PyObject *name)
{
    /* Keyword names in compiled code are interned: one comparison of pointers, usually. */
    return given == name || PyUnicode_Compare(given, name) == 0;  /* keyword names are str */
}

/* Fills values[] (NULL where not given) from a vectorcall's arguments against the parameters
   names[] of a method, of which the first n_positional may be given by position and the first
   n_required must be given. Returns 0, or -1 (no error set) for a call that does not fit the
   signature: the slow path takes it, whose Python method of the same signature counts and logs
   the TypeError instead of raising it into the training loop. */
static int
parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *const *names,
      Py_ssize_t n_positional, Py_ssize_t n_required, Py_ssize_t n_names, PyObject **values)
{
    if (nargs > n_positional) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_names; i++) {
        values[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t n_keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < n_keywords; k++) {
        PyObject *given = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        while (i < n_names && !same_name(given, names[i])) {
            i++;
        }
        if (i == n_names || values[i] != NULL) {  /* unknown, or given twice */
            return -1;
        }
        values[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < n_required; i++) {
        if (values[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

/* A step the fast path takes: an int (not a subclass, not a bool) from 0 to max_count. */
static inline int
plain_step(PyObject *value, long long max_count, long long *step)
{
    if (value == NULL || !PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || number < 0 || number > max_count) {
        return 0;  /* -1 with no error set: a negative step */
    }
    *step = number;
    return 1;
}

static inline int
no_time(PyObject *value)
{
    return value == NULL || value == Py_None;
}

/* The recorder's Python method of the same signature: every call the fast path does not take. */
static PyObject *
slow(PyObject *self, PyObject *name, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *small[12];
    PyObject **stack = total + 1 <= (Py_ssize_t)(sizeof(small) / sizeof(small[0]))
        ? small : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self;
    memcpy(stack + 1, args, (size_t)total * sizeof(PyObject *));
    PyObject *result = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return result;
}

PyDoc_STRVAR(record_step_start_time_doc,
"record_step_start_time($self, /, step, start_time=None)\n--\n\n"
"Records the start of training step ``step``.");

static PyObject *
record_step_start_time(FastPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *parameters[2] = {NAME_STEP, NAME_START_TIME};
    PyObject *values[2];
    if (parse(args, PyVectorcall_NARGS(nargsf), kwnames, parameters, 2, 1, 2, values) < 0) {
        return slow((PyObject *)self, SLOW_STEP_START, args, nargsf, kwnames);
    }
    Lane *lane = self->lane;
    long long step, time_us;
    Slot *slot;
    if (lane != NULL && plain_step(values[0], lane->max_count, &step) && no_time(values[1])
            && (time_us = now_us()) >= 0 && (slot = Lane_claim(lane)) != NULL) {
        slot->time_us = time_us;
        slot->type = SLOT_STEP_START;
        slot->numbers.step = step;
        Lane_filled(lane);
        Py_RETURN_NONE;
    }
    return slow((PyObject *)self, SLOW_STEP_START, args, nargsf, kwnames);
}

static PyObject *
data_loading(FastPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames, PyObject *parameter,
             unsigned char type, PyObject *slow_name)
{
    PyObject *values[1];
    if (parse(args, PyVectorcall_NARGS(nargsf), kwnames, &parameter, 1, 0, 1, values) < 0) {
        return slow((PyObject *)self, slow_name, args, nargsf, kwnames);
    }
    Lane *lane = self->lane;
    long long time_us;
    Slot *slot;
    if (lane != NULL && no_time(values[0]) && (time_us = now_us()) >= 0 && (slot = Lane_claim(lane)) != NULL) {
        slot->time_us = time_us;
        slot->type = type;
        Lane_filled(lane);
        Py_RETURN_NONE;
    }
    return slow((PyObject *)self, slow_name, args, nargsf, kwnames);
}

PyDoc_STRVAR(record_data_loading_start_time_doc,
"record_data_loading_start_time($self, /, start_time=None)\n--\n\n"
"Records the start of a data-loading span.");

static PyObject *
record_data_loading_start_time(FastPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return data_loading(self, args, nargsf, kwnames, NAME_START_TIME, SLOT_DATA_LOADING_START,
                        SLOW_DATA_LOADING_START);
}

PyDoc_STRVAR(record_data_loading_end_time_doc,
"record_data_loading_end_time($self, /, end_time=None)\n--\n\n"
"Records the end of a data-loading span.");

static PyObject *
record_data_loading_end_time(FastPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return data_loading(self, args, nargsf, kwnames, NAME_END_TIME, SLOT_DATA_LOADING_END,
                        SLOW_DATA_LOADING_END);
}

PyDoc_STRVAR(record_model_metrics_doc,
"record_model_metrics($self, /, step, *, loss=None, step_time_s=None, tokens_per_s=None, "
"samples_per_s=None, mfu=None, tflops_per_device=None, time_=None)\n--\n\n"
"Records the model metrics of one step; metrics left as ``None`` were not measured.\n\n"
"A non-finite loss (a diverged run) is recorded as it is.");

static PyObject *
record_model_metrics(FastPath *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    enum { N = 2 + N_METRICS };
    PyObject *parameters[N], *values[N];
    parameters[0] = NAME_STEP;
    for (int i = 0; i < N_METRICS; i++) {
        parameters[1 + i] = METRIC_NAME_OBJECTS[i];
    }
    parameters[N - 1] = NAME_TIME_;
    if (parse(args, PyVectorcall_NARGS(nargsf), kwnames, parameters, 1, 1, N, values) < 0) {
        return slow((PyObject *)self, SLOW_MODEL_METRICS, args, nargsf, kwnames);
    }
    Lane *lane = self->lane;
    long long step, time_us;
    Slot *slot;
    if (lane == NULL || !plain_step(values[0], lane->max_count, &step) || !no_time(values[N - 1])) {
        return slow((PyObject *)self, SLOW_MODEL_METRICS, args, nargsf, kwnames);
    }
    unsigned char present = 0;
    for (int i = 0; i < N_METRICS; i++) {
        PyObject *value = values[1 + i];
        if (value != NULL && value != Py_None) {
            if (!PyFloat_CheckExact(value)) {
                return slow((PyObject *)self, SLOW_MODEL_METRICS, args, nargsf, kwnames);
            }
            present |= (unsigned char)(1u << i);
        }
    }
    if ((time_us = now_us()) < 0 || (slot = Lane_claim(lane)) == NULL) {
        return slow((PyObject *)self, SLOW_MODEL_METRICS, args, nargsf, kwnames);
    }
    slot->time_us = time_us;
    slot->type = SLOT_MODEL_METRICS;
    slot->present = present;
    slot->numbers.step = step;
    for (int i = 0; i < N_METRICS; i++) {
        slot->numbers.values[i] = (present & (1u << i)) ? PyFloat_AS_DOUBLE(values[1 + i]) : 0.0;
    }
    Lane_filled(lane);
    Py_RETURN_NONE;
}

static PyObject *
FastPath_get_lane(FastPath *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->lane == NULL ? Py_None : (PyObject *)self->lane);
}

static int
FastPath_set_lane(FastPath *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value != NULL && value != Py_None && !PyObject_TypeCheck(value, &LaneType)) {
        PyErr_Format(PyExc_TypeError, "_lane must be an emitter._lane.Lane or None, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    Lane *old = self->lane;
    self->lane = (value == NULL || value == Py_None) ? NULL : (Lane *)Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static int
FastPath_traverse(FastPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->lane);
    return 0;
}

static int
FastPath_clear(FastPath *self)
{
    Py_CLEAR(self->lane);
    return 0;
}

static void
FastPath_dealloc(FastPath *self)
{
    PyObject_GC_UnTrack(self);
    FastPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef FastPath_methods[] = {
    {"record_step_start_time", (PyCFunction)(void (*)(void))record_step_start_time,
     METH_FASTCALL | METH_KEYWORDS, record_step_start_time_doc},
    {"record_data_loading_start_time", (PyCFunction)(void (*)(void))record_data_loading_start_time,
     METH_FASTCALL | METH_KEYWORDS, record_data_loading_start_time_doc},
    {"record_data_loading_end_time", (PyCFunction)(void (*)(void))record_data_loading_end_time,
     METH_FASTCALL | METH_KEYWORDS, record_data_loading_end_time_doc},
    {"record_model_metrics", (PyCFunction)(void (*)(void))record_model_metrics,
     METH_FASTCALL | METH_KEYWORDS, record_model_metrics_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FastPath_getset[] = {
    {"_lane", (getter)FastPath_get_lane, (setter)FastPath_set_lane,
     "The lane the per-step calls record into, or None: every call takes the slow path.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(FastPath_doc,
"The per-step calls of a recorder, compiled: see the module's docstring.");

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emitter._lane.FastPath",
    .tp_doc = FastPath_doc,
    .tp_basicsize = sizeof(FastPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)FastPath_dealloc,
    .tp_traverse = (traverseproc)FastPath_traverse,
    .tp_clear = (inquiry)FastPath_clear,
    .tp_methods = FastPath_methods,
    .tp_getset = FastPath_getset,
};

/* -- encode_events ---------------------------------------------------------------------------- */

/* The events of a batch as the JSON array goodput_schemas.wire.encode_events writes, for the
   records the per-step calls queue: a step_start's step, a model_metrics tuple of floats and Nones,
   a data-loading span's empty body. Any other dict body is written by the caller's encode_body; a
   batch holding any other record is left to the caller (None). The finite floats are formatted by
   the caller's dumps (orjson.dumps, as wire.encode_events formats them), all in one call. */

typedef struct {
    char *data;
    size_t length;
    size_t capacity;
} Buffer;

static int
buffer_write(Buffer *buffer, const char *text, size_t length)
{
    if (buffer->length + length > buffer->capacity) {
        size_t capacity = buffer->capacity * 2 > buffer->length + length ? buffer->capacity * 2
                                                                          : buffer->length + length;
        char *data = PyMem_Realloc(buffer->data, capacity);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        buffer->data = data;
        buffer->capacity = capacity;
    }
    memcpy(buffer->data + buffer->length, text, length);
    buffer->length += length;
    return 0;
}

#define WRITE(buffer, literal) buffer_write((buffer), (literal), sizeof(literal) - 1)

static int
buffer_int(Buffer *buffer, long long value)
{
    char text[24], *start = text + sizeof text;
    unsigned long long magnitude = value < 0 ? 0ull - (unsigned long long)value : (unsigned long long)value;
    do {
        *--start = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0) {
        *--start = '-';
    }
    return buffer_write(buffer, start, (size_t)(text + sizeof text - start));
}

/* An exact int that fits a long long, into *value; 0 if it is not one (no error set). */
static int
exact_long(PyObject *object, long long *value)
{
    if (!PyLong_CheckExact(object)) {
        return 0;
    }
    int overflow;
    *value = PyLong_AsLongLongAndOverflow(object, &overflow);
    return !overflow && !(*value == -1 && PyErr_Occurred());
}

/* A kind written as it is: a name of letters, digits and underscores. */
static int
plain_name(PyObject *kind)
{
    if (!PyUnicode_CheckExact(kind) || !PyUnicode_IS_ASCII(kind) || PyUnicode_GET_LENGTH(kind) == 0) {
        return 0;
    }
    const char *text = (const char *)PyUnicode_DATA(kind);
    for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(kind); i++) {
        if (!(isalnum((unsigned char)text[i]) || text[i] == '_')) {
            return 0;
        }
    }
    return 1;
}

static int
is_kind(PyObject *kind, PyObject *name)
{
    return kind == name || PyUnicode_Compare(kind, name) == 0;
}

/* Whether the record is one encode_events writes (1) or not (0); -1 on an error. Appends its
   finite metrics to floats. */
static int
check_record(PyObject *record, PyObject *floats)
{
    long long number;
    if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 4
            || !exact_long(PyTuple_GET_ITEM(record, 0), &number)
            || !exact_long(PyTuple_GET_ITEM(record, 1), &number) || !plain_name(PyTuple_GET_ITEM(record, 2))) {
        return 0;
    }
    PyObject *kind = PyTuple_GET_ITEM(record, 2), *body = PyTuple_GET_ITEM(record, 3);
    if (PyDict_CheckExact(body)) {
        return 1;
    }
    if (is_kind(kind, KIND_STEP_START)) {
        return exact_long(body, &number);
    }
    if (!is_kind(kind, KIND_MODEL_METRICS) || !PyTuple_CheckExact(body)
            || PyTuple_GET_SIZE(body) != 1 + N_METRICS || !exact_long(PyTuple_GET_ITEM(body, 0), &number)) {
        return 0;
    }
    for (int i = 1; i <= N_METRICS; i++) {
        PyObject *value = PyTuple_GET_ITEM(body, i);
        if (value != Py_None && !PyFloat_CheckExact(value)) {
            return 0;
        }
    }
    for (int i = 1; i <= N_METRICS; i++) {
        PyObject *value = PyTuple_GET_ITEM(body, i);
        if (value != Py_None && isfinite(PyFloat_AS_DOUBLE(value)) && PyList_Append(floats, value) < 0) {
            return -1;
        }
    }
    return 1;
}

/* The finite floats' digits, in dumps' JSON array of them: next is the next one's first. */
typedef struct {
    const char *next;
    const char *end;
} Digits;

/* A metric: its digits from *digits, or a non-finite value as proto3 JSON has it (the strings
   of wire.json_double). */
static int
write_double(Buffer *buffer, double value, Digits *digits)
{
    if (isnan(value)) {
        return WRITE(buffer, "\"NaN\"");
    }
    if (isinf(value)) {
        return value > 0 ? WRITE(buffer, "\"Infinity\"") : WRITE(buffer, "\"-Infinity\"");
    }
    const char *end = digits->next;
    while (end < digits->end && *end != ',' && *end != ']') {
        end++;
    }
    if (end == digits->next || end == digits->end) {
        PyErr_SetString(PyExc_RuntimeError, "encode_events: dumps wrote fewer floats than given");
        return -1;
    }
    int done = buffer_write(buffer, digits->next, (size_t)(end - digits->next));
    digits->next = end + 1;
    return done;
}

static int
write_body(Buffer *buffer, PyObject *kind, PyObject *body, PyObject *encode_body, Digits *digits)
{
    if (PyDict_CheckExact(body)) {
        if (PyDict_GET_SIZE(body) == 0) {
            return WRITE(buffer, "{}");
        }
        PyObject *encoded = PyObject_CallOneArg(encode_body, body);
        if (encoded == NULL) {
            return -1;
        }
        int done = PyBytes_Check(encoded)
            ? buffer_write(buffer, PyBytes_AS_STRING(encoded), (size_t)PyBytes_GET_SIZE(encoded))
            : (PyErr_SetString(PyExc_TypeError, "encode_body must return bytes"), -1);
        Py_DECREF(encoded);
        return done;
    }
    PyObject *step = is_kind(kind, KIND_STEP_START) ? body : PyTuple_GET_ITEM(body, 0);
    if (WRITE(buffer, "{\"step\":") < 0 || buffer_int(buffer, PyLong_AsLongLong(step)) < 0) {
        return -1;
    }
    for (int i = 1; step != body && i <= N_METRICS; i++) {
        PyObject *value = PyTuple_GET_ITEM(body, i);
        if (value != Py_None && (WRITE(buffer, ",\"") < 0
                || buffer_write(buffer, METRIC_NAMES[i - 1], strlen(METRIC_NAMES[i - 1])) < 0
                || WRITE(buffer, "\":") < 0 || write_double(buffer, PyFloat_AS_DOUBLE(value), digits) < 0)) {
            return -1;
        }
    }
    return WRITE(buffer, "}");
}

static int
write_record(Buffer *buffer, PyObject *record, PyObject *encode_body, Digits *digits)
{
    PyObject *kind = PyTuple_GET_ITEM(record, 2);
    if (WRITE(buffer, "{\"seq\":") < 0 || buffer_int(buffer, PyLong_AsLongLong(PyTuple_GET_ITEM(record, 0))) < 0
            || WRITE(buffer, ",\"time_us\":") < 0
            || buffer_int(buffer, PyLong_AsLongLong(PyTuple_GET_ITEM(record, 1))) < 0 || WRITE(buffer, ",\"") < 0
            || buffer_write(buffer, (const char *)PyUnicode_DATA(kind), (size_t)PyUnicode_GET_LENGTH(kind)) < 0
            || WRITE(buffer, "\":") < 0 || write_body(buffer, kind, PyTuple_GET_ITEM(record, 3), encode_body, digits) < 0) {
        return -1;
    }
    return WRITE(buffer, "}");
}

/* The records checked (a copy of the list, which encode_body may change), the floats' digits,
   then the array. */
static PyObject *
encode_list(PyObject *records, PyObject *encode_body, PyObject *dumps, PyObject *floats)
{
    Py_ssize_t count = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < count; i++) {
        int mine = check_record(PyList_GET_ITEM(records, i), floats);
        if (mine <= 0) {
            return mine < 0 ? NULL : Py_NewRef(Py_None);
        }
    }
    PyObject *written = PyList_GET_SIZE(floats) ? PyObject_CallOneArg(dumps, floats) : PyBytes_FromString("[]");
    if (written == NULL) {
        return NULL;
    }
    if (!PyBytes_Check(written)) {
        Py_DECREF(written);
        PyErr_SetString(PyExc_TypeError, "dumps must return bytes");
        return NULL;
    }
    Digits digits = {PyBytes_AS_STRING(written) + 1, PyBytes_AS_STRING(written) + PyBytes_GET_SIZE(written)};
    Buffer buffer = {NULL, 0, 0};
    int done = WRITE(&buffer, "[");
    for (Py_ssize_t i = 0; done == 0 && i < count; i++) {
        done = (i > 0 && WRITE(&buffer, ",") < 0) ? -1
            : write_record(&buffer, PyList_GET_ITEM(records, i), encode_body, &digits);
    }
    PyObject *encoded = done < 0 || WRITE(&buffer, "]") < 0 ? NULL
        : PyBytes_FromStringAndSize(buffer.data, (Py_ssize_t)buffer.length);
    PyMem_Free(buffer.data);
    Py_DECREF(written);
    return encoded;
}

PyDoc_STRVAR(encode_events_doc,
"encode_events(records, encode_body, dumps, /)\n--\n\n"
"The JSON array of the events of the list ``records`` ((seq, time_us, kind, body) each), as\n"
"goodput_schemas.wire.encode_events writes it: a non-empty dict body written by\n"
"``encode_body(body)``, the finite metrics by one ``dumps(list_of_floats)``; None if a record is\n"
"not one this function writes, for the caller to encode the whole list.");

static PyObject *
encode_events(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "encode_events(records: list, encode_body, dumps, /)");
        return NULL;
    }
    PyObject *records = PyList_GetSlice(args[0], 0, PyList_GET_SIZE(args[0]));
    PyObject *floats = PyList_New(0);
    PyObject *encoded = records != NULL && floats != NULL ? encode_list(records, args[1], args[2], floats) : NULL;
    Py_XDECREF(records);
    Py_XDECREF(floats);
    return encoded;
}

static PyMethodDef module_methods[] = {
    {"encode_events", (PyCFunction)(void (*)(void))encode_events, METH_FASTCALL, encode_events_doc},
    {NULL},
};

/* -- the module ------------------------------------------------------------------------------ */

static int
intern(PyObject **name, const char *text)
{
    *name = PyUnicode_InternFromString(text);
    return *name == NULL ? -1 : 0;
}

static struct PyModuleDef lane_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "emitter._lane",
    .m_doc = "The compiled fast path of a recorder's per-step calls (see emitter/lane.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__lane(void)
{
    if (intern(&KIND_STEP_START, "step_start") || intern(&KIND_MODEL_METRICS, "model_metrics")
            || intern(&KIND_DATA_LOADING_START, "data_loading_start")
            || intern(&KIND_DATA_LOADING_END, "data_loading_end") || intern(&NAME_STEP, "step")
            || intern(&NAME_START_TIME, "start_time") || intern(&NAME_END_TIME, "end_time")
            || intern(&NAME_TIME_, "time_") || intern(&SLOW_STEP_START, "_slow_step_start")
            || intern(&SLOW_MODEL_METRICS, "_slow_model_metrics")
            || intern(&SLOW_DATA_LOADING_START, "_slow_data_loading_start")
            || intern(&SLOW_DATA_LOADING_END, "_slow_data_loading_end")) {
        return NULL;
    }
    for (int i = 0; i < N_METRICS; i++) {
        if (intern(&METRIC_NAME_OBJECTS[i], METRIC_NAMES[i])) {
            return NULL;
        }
    }
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&FastPathType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&lane_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Lane", (PyObject *)&LaneType) < 0
            || PyModule_AddObjectRef(module, "FastPath", (PyObject *)&FastPathType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
