// distckpt._distckpt.Comm: a Gloo group, or an external communicator whose collectives are Python callables
// (the trampolines below run them on distckpt's threads, with the GIL).
#include "bindings/comm.h"

#include "bindings/register.h"

namespace distckpt_python {

std::shared_ptr<Comm> Comm::Gloo(int rank, int world_size, std::optional<std::string> rendezvous,
                                 std::optional<std::string> prefix, std::optional<std::string> iface,
                                 std::optional<std::string> hostname, uint64_t timeout_ms) {
  dckpt_gloo_options o;
  Check(dckpt_gloo_options_init(&o, DCKPT_GLOO_OPTIONS_VERSION));
  o.rank = rank;
  o.world_size = world_size;
  o.rendezvous = rendezvous ? rendezvous->c_str() : nullptr;
  o.prefix = prefix ? prefix->c_str() : nullptr;
  o.iface = iface ? iface->c_str() : nullptr;
  o.hostname = hostname ? hostname->c_str() : nullptr;
  o.timeout_ms = timeout_ms;
  auto c = std::shared_ptr<Comm>(new Comm());
  int rc;
  {
    py::gil_scoped_release nogil;  // rendezvous waits for every rank
    rc = dckpt_comm_new_gloo(&c->comm_, &o);
  }
  Check(rc);
  return c;
}

std::shared_ptr<Comm> Comm::External(int rank, int size, py::object allgather, py::object broadcast,
                                     py::object barrier) {
  if (!PyCallable_Check(allgather.ptr()) || !PyCallable_Check(broadcast.ptr())) {
    throw py::type_error("allgather and broadcast must be callable");
  }
  if (!barrier.is_none() && !PyCallable_Check(barrier.ptr())) throw py::type_error("barrier must be callable or None");
  auto c = std::shared_ptr<Comm>(new Comm());
  c->allgather_ = std::move(allgather);
  c->broadcast_ = std::move(broadcast);
  c->barrier_ = std::move(barrier);
  dckpt_comm_callbacks cb;
  Check(dckpt_comm_callbacks_init(&cb, DCKPT_COMM_CALLBACKS_VERSION));
  cb.rank = rank;
  cb.size = size;
  cb.allgather = &Comm::AllgatherTrampoline;
  cb.broadcast = &Comm::BroadcastTrampoline;
  cb.barrier = c->barrier_.is_none() ? nullptr : &Comm::BarrierTrampoline;
  cb.user_data = c.get();
  c->size_ = size;
  Check(dckpt_comm_new_external(&c->comm_, &cb));
  return c;
}

Comm::~Comm() {
  // No collective can be running: every call that uses the communicator holds a reference to it.
  dckpt_comm_free(comm_);
}

dckpt_comm* Comm::get() {
  if (comm_ == nullptr) throw NativeError(DCKPT_ESTATE, "the communicator is closed");
  return comm_;
}

int Comm::rank() {
  int r = 0;
  Check(dckpt_comm_rank(&r, get()));
  return r;
}

int Comm::size() {
  int s = 0;
  Check(dckpt_comm_size(&s, get()));
  return s;
}

void Comm::Barrier(uint64_t timeout_ms) {
  dckpt_comm* c = get();
  ++users_;
  struct Done {
    std::atomic<int>& n;
    ~Done() { --n; }
  } done{users_};
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_comm_barrier(c, timeout_ms);
  }
  CheckWithCallbacks(rc, &errors_);
}

void Comm::Abort(const std::string& reason) {
  dckpt_comm* c = get();
  Check(dckpt_comm_abort(c, reason.c_str()));
}

void Comm::Close() {
  if (users_.load() > 0) {
    throw NativeError(DCKPT_ESTATE,
                      "the communicator is in use (an async save or a collective is running); "
                      "wait for it before closing the communicator");
  }
  dckpt_comm* c = comm_;
  comm_ = nullptr;
  py::gil_scoped_release nogil;
  dckpt_comm_free(c);
}

void Comm::ReleaseView(py::object& view) {
  try {
    view.attr("release")();
  } catch (py::error_already_set&) {
    // Still exported (e.g. np.frombuffer kept it): nothing more can be done from here.
  }
}

int Comm::AllgatherTrampoline(const void* send, size_t send_size, void* recv, uint64_t timeout_ms, void* user) {
  auto* self = static_cast<Comm*>(user);
  CallbackGil gil;
  try {
    int size = self->size_cached();
    py::object send_view = py::memoryview::from_memory(send, static_cast<py::ssize_t>(send_size));
    py::object recv_view = py::memoryview::from_memory(recv, static_cast<py::ssize_t>(send_size * size));
    try {
      self->allgather_(send_view, recv_view, timeout_ms);
    } catch (...) {
      ReleaseView(send_view);
      ReleaseView(recv_view);
      throw;
    }
    ReleaseView(send_view);
    ReleaseView(recv_view);
    return 0;
  } catch (py::error_already_set& e) {
    self->errors_.Keep(e);
    return 1;
  }
}

int Comm::BroadcastTrampoline(void* buf, size_t size, int root, uint64_t timeout_ms, void* user) {
  auto* self = static_cast<Comm*>(user);
  CallbackGil gil;
  try {
    py::object view = py::memoryview::from_memory(buf, static_cast<py::ssize_t>(size));
    try {
      self->broadcast_(view, root, timeout_ms);
    } catch (...) {
      ReleaseView(view);
      throw;
    }
    ReleaseView(view);
    return 0;
  } catch (py::error_already_set& e) {
    self->errors_.Keep(e);
    return 1;
  }
}

int Comm::BarrierTrampoline(uint64_t timeout_ms, void* user) {
  auto* self = static_cast<Comm*>(user);
  CallbackGil gil;
  try {
    self->barrier_(timeout_ms);
    return 0;
  } catch (py::error_already_set& e) {
    self->errors_.Keep(e);
    return 1;
  }
}

void RegisterComm(py::module_& m) {
  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm")
      .def_static("gloo", &Comm::Gloo, py::arg("rank"), py::arg("world_size"), py::arg("rendezvous"), py::arg("prefix"),
                  py::arg("iface"), py::arg("hostname"), py::arg("timeout_ms"))
      .def_static("external", &Comm::External, py::arg("rank"), py::arg("size"), py::arg("allgather"),
                  py::arg("broadcast"), py::arg("barrier"))
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("size", &Comm::size)
      .def_property_readonly("closed", &Comm::closed)
      .def("barrier", &Comm::Barrier, py::arg("timeout_ms"))
      .def("abort", &Comm::Abort, py::arg("reason"))
      .def("close", &Comm::Close);
}

}  // namespace distckpt_python
