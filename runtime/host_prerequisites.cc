#include "runtime/host_prerequisites.h"

namespace nsbox::runtime {

std::vector<DoctorLayer> MissingPrerequisites(const Features& features) {
  DoctorInput in;
  in.features = features;
  in.euid = 0;  // the daemon has checked that it is root; privileges are not the kernel's
  std::vector<DoctorLayer> out;
  for (auto& layer : DoctorLayers(in)) {
    // Without user namespaces, the namespace set is not tried ("needs user namespaces"): its
    // fix (a kernel with CONFIG_*_NS) would send the reader the wrong way.
    if (layer.key == "namespaces" && !features.user_namespaces.available) continue;
    if (layer.required && layer.status != "ok" && layer.key != "privileges") {
      out.push_back(std::move(layer));
    }
  }
  return out;
}

std::string DescribeMissing(const std::vector<DoctorLayer>& missing) {
  std::string out;
  for (const DoctorLayer& l : missing) {
    if (!out.empty()) out += "\n";
    out += l.name + ": " + l.detail;
    if (!l.fix.empty()) out += "; fix: " + l.fix;
  }
  return out;
}

}  // namespace nsbox::runtime
