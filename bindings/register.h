// Internal to the extension module: its parts, each registering its classes and functions into the one module
// (cf. tensorstore's Python extension). module.cc calls them in this order, which is the order the module had when
// it was one file (pybind11 writes the signatures of a function with the names of the types registered before it).
#ifndef DISTCKPT_BINDINGS_REGISTER_H_
#define DISTCKPT_BINDINGS_REGISTER_H_

#include <pybind11/pybind11.h>

namespace distckpt_python {

void RegisterComm(pybind11::module_& m);        // comm.cc
void RegisterState(pybind11::module_& m);       // state.cc
void RegisterSaveFuture(pybind11::module_& m);  // save_load.cc
void RegisterReader(pybind11::module_& m);      // reader.cc
void RegisterSaveLoad(pybind11::module_& m);    // save_load.cc
void RegisterTools(pybind11::module_& m);       // tools.cc
void RegisterStorage(pybind11::module_& m);     // storage.cc
void RegisterS3(pybind11::module_& m);          // s3.cc (adds to storage.cc's Storage)
void RegisterManager(pybind11::module_& m);     // manager.cc

}  // namespace distckpt_python

#endif  // DISTCKPT_BINDINGS_REGISTER_H_
