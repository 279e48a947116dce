// The exceptions of every command as exit codes (command_errors.hpp).
#include "mfattn/app/command_errors.hpp"

#include <exception>
#include <filesystem>
#include <new>
#include <ostream>
#include <stdexcept>

#include "mfattn/app/config.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/backends/backend_errors.hpp"
#include "mfattn/io/h5md.hpp"

namespace mfattn {

int report_current_exception(std::string_view command, std::ostream& err) {
  const auto report = [&](int code, std::string_view kind, const std::string& what) {
    err << "mfattn " << command << ": " << kind << one_line(what) << '\n';
    return code;
  };
  try {
    throw;
  } catch (const UsageError& e) {
    return report(kExitUsage, "", e.what());
  } catch (const BackendUnavailable& e) {
    return report(kExitUsage, "", e.what());
  } catch (const std::invalid_argument& e) {
    return report(kExitUsage, "", e.what());
  } catch (const NotMfattnFile& e) {
    return report(kExitUsage, "", e.what());
  } catch (const OutputExists& e) {
    return report(kExitUsage, "", e.what());
  } catch (const NumericalError& e) {
    return report(kExitNumerical, "numerical failure: ", e.what());
  } catch (const DeviceFailure& e) {
    return report(kExitIo, "device failure: ", e.what());
  } catch (const IoError& e) {
    return report(kExitIo, "", e.what());
  } catch (const std::bad_alloc&) {
    return report(kExitIo, "", "out of memory (an allocation failed; make the run smaller)");
  } catch (const std::filesystem::filesystem_error& e) {
    return report(kExitIo, "", e.what());
  } catch (const std::exception& e) {
    return report(kExitInternal, "internal error: ", e.what());
  } catch (...) {
    return report(kExitInternal, "internal error: ", "unknown exception");
  }
}

int guarded(std::string_view command, const std::function<int()>& body, std::ostream& err) {
  try {
    return body();
  } catch (...) {
    return report_current_exception(command, err);
  }
}

}  // namespace mfattn
